"""Reward service and its client (docs/reward.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.config.base import Section


class CodeSandboxConfig(Section):
    """Limits of the `code` scorer's sandboxed subprocess (one per completion)."""

    wall_s: float = Field(
        4.0, gt=0, description="Wall-clock limit of one sandboxed run (the process group is killed); "
        "the service waits at least this + 2 s for it."
    )
    cpu_s: int = Field(3, ge=1, description="RLIMIT_CPU of the sandboxed process, seconds.")
    memory_mb: int = Field(
        512, ge=64, description="Memory of one sandbox, MiB: the memory limit of its cgroup (all its processes and "
        "its tmpfs files together, swap included) and RLIMIT_AS of each process.")
    output_bytes: int = Field(1 << 20, ge=1024, description="Cap on the program's output (per test and per file).")
    max_tests: int = Field(100, ge=1, description="Most test cases one reference may carry.")
    pids: int = Field(64, ge=4, description="pids.max of one sandbox's cgroup (without cgroups: RLIMIT_NPROC, which "
                      "uid 65534's processes share across all sandboxes).")
    disk_mb: int = Field(64, ge=1, description="Size of one sandbox's tmpfs work dir (and of its /tmp), MiB.")
    cgroups: Literal["auto", "v2", "v1", "off"] = Field(
        "auto", description="Per-sandbox cgroup: auto = v2 when its memory and pids controllers can be delegated, "
        "else v1 memory+pids, else none (rlimits only, with a warning); off = rlimits only.")
    cgroup_parent: str = Field(
        "", description="cgroup v2 directory delegated to the service to create sandbox cgroups under ('' = the "
        "service's own cgroup, usable when it holds no processes or is the root).")


class RubricCriterion(Section):
    """One named criterion of a rubric: judged on its own, weighted in the sum."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                      description="Its name in metrics (`criterion/<name>`) and in the template's {criterion}.")
    description: str = Field(..., min_length=1, description="What the judge checks, in words ({description}).")
    weight: float = Field(1.0, gt=0, description="Its weight; the reward is the weighted mean of the criteria.")


class PairwiseConfig(Section):
    """`judge.mode: pairwise`: the group's completions compared with each other (reward_service/judge/pairwise.py)."""

    both_orders: bool = Field(
        True, description="Judge every pair in both orders (A/B and B/A) and average, so the judge's preference "
        "for a position cancels; false = one order, the lower index first.")
    max_opponents: int = Field(
        0, ge=0, description="Compare each completion with at most this many others, chosen round-robin "
        "(0 = all others: n(n-1)/2 pairs per group).")


class JudgeConfig(Section):
    """An LLM judge (generative reward model) behind `jetrl reward serve --task judge` (docs/reward.md, "The judge").

    The judge's own weights are fixed: it loads `model` once and never follows the policy's versions.
    """

    backend: Literal["local", "vllm", "openai"] = Field(
        "local", description="local / vllm: jetrl's own engine (rollout_service/engines) in the reward process, "
        "with the local engine's continuous batching or a vLLM server; openai: any OpenAI-compatible "
        "chat-completions endpoint (`base_url`) through the official openai client.")
    model: str = Field(
        "", description="local / vllm: the judge's model dir (a Hugging Face dir; '' = the tiny test model); "
        "openai: the model name sent with each request.")
    device: str = Field("cpu", description="local: torch device of the judge model.")
    max_batch: int = Field(32, ge=1, description="local: most judge prompts decoding (and prefilled) together "
                           "(continuous batching); more wait, and request_timeout_s starts when the engine takes one.")
    torch_threads: int = Field(0, ge=0, description="local: torch threads of the judge's engine (0 = torch's default).")
    vllm_url: str = Field("", description="vllm: base URL of the vLLM server serving `model`.")
    base_url: str = Field("", description="openai: the endpoint's base URL, e.g. https://api.example.com/v1.")
    api_key_file: str = Field(
        "", description="openai: a file holding the API key, mode 0600 (refused otherwise). There is no inline "
        "key setting, so a key is never on a command line or in a config file.")
    api_key_env: str = Field(
        "JETRL_JUDGE_API_KEY", description="openai: the environment variable holding the key when api_key_file "
        "is '' (unset or empty: no key is sent, for local servers).")
    request_timeout_s: float = Field(60.0, gt=0, description="Time limit of one judge call (local: from when the "
                                     "engine takes it); past it the whole request fails (the reward error path: "
                                     "retried, then dead-lettered; the group's finished judgements stay cached).")
    max_concurrency: int = Field(64, ge=1, description="Judge calls in flight at once across all requests of this "
                                 "process (the batch the engine or endpoint sees).")
    max_new_tokens: int = Field(64, ge=1, description="Tokens the judge may write per call (score_line, json, pairwise).")
    temperature: float = Field(0.0, ge=0, description="Judge sampling temperature (0 = greedy, reproducible).")
    mode: Literal["pointwise", "pairwise"] = Field(
        "pointwise", description="pointwise: each completion judged alone (per rubric criterion); pairwise: "
        "completions of a group compared, reward = win rate.")
    parser: Literal["score_line", "json", "yes_no"] = Field(
        "score_line", description="How a pointwise judgement becomes a score in [0, 1]: score_line = the last "
        "line 'Score: X' (or 'X/scale') divided by `scale`; json = field `json_field` of the last JSON object, "
        "divided by `scale`; yes_no = P(yes) / (P(yes) + P(no)) of the judge's first token (needs top logprobs).")
    scale: float = Field(10.0, gt=0, description="score_line / json: the top of the judge's scale (a score of 0..scale).")
    json_field: str = Field("score", min_length=1, description="json: the field holding the score.")
    instructions: str = Field(
        "How well does the response answer the user's request? Judge helpfulness, correctness and clarity.",
        description="The criterion judged when `rubric` is empty ({description} in the template).")
    rubric: list[RubricCriterion] = Field(
        default_factory=list, description="Named, weighted criteria, each judged on its own ([] = one criterion, "
        "`instructions`, named 'overall').")
    template: str = Field(
        "", description="Pointwise prompt template ('' = the built-in for the parser). Fields: {prompt}, "
        "{reference}, {completion}, {criterion}, {description}, {scale}; the completion is fenced by a nonce.")
    pairwise_template: str = Field(
        "", description="Pairwise prompt template ('' = the built-in). Fields: {prompt}, {reference}, "
        "{completion_a}, {completion_b}, {description}.")
    pairwise: PairwiseConfig = Field(default_factory=PairwiseConfig)
    max_completion_chars: int = Field(
        4000, ge=1, description="A completion longer than this is cut (its head kept, '[truncated]' appended) "
        "before it is shown to the judge, so a long answer cannot overflow the judge's context.")
    parse_retries: int = Field(
        1, ge=0, description="A judgement the parser refuses is asked again this many times (at temperature "
        "max(temperature, 0.7)) before it counts as unparseable.")
    on_unparseable: Literal["fail_group", "error_zero"] = Field(
        "fail_group", description="A judgement still unparseable: fail_group = the whole request gets an error "
        "(retried, then dead-lettered with the judge's text), error_zero = that completion gets reward 0 with "
        "its error in errors[i] (counted in jetrl_reward_completion_errors_total).")
    follow_policy: bool = Field(
        False, description="local / vllm: swap in every weight version the run's trainer announces, so the policy "
        "judges itself (judge.model must be the policy's model). Off: the judge's weights are fixed, which is what "
        "keeps its scores comparable and harder to train against (reward_service/judge/follow.py).")
    cache_size: int = Field(
        65536, ge=0, description="Judgements remembered per process (LRU over criterion, prompt, reference, "
        "completion; pairs for pairwise): an identical question is not judged twice (0 = off).")


class RewardConfig(Section):
    task: str = Field("gsm8k", description="Reward task: a built-in scorer name, served on jetrl.reward.<task>.")
    scorer: str = Field("", description="Custom scorer as 'package.module:function' ('' = the built-in for `task`).")
    executor: Literal["auto", "inline", "thread", "process"] = Field(
        "auto",
        description="Where scoring runs: inline (event loop), thread, process (killable pool). auto = the "
        "built-in's choice (gsm8k/exact/maxdigit/sort inline, math/regex process, code thread; custom: thread).",
    )
    concurrency: int = Field(64, ge=1, description="Requests one service process scores at once.")
    processes: int = Field(0, ge=0, description="Size of the process pool for `process` scorers (0 = CPU count).")
    timeout_s: float = Field(10.0, gt=0, description="Client: time to wait for one reply before retrying.")
    retries: int = Field(3, ge=0, description="Client: retries on timeout or no responders.")
    retry_backoff_s: float = Field(0.2, ge=0, description="Client: first pause before a retry (doubles, max 2 s).")
    scorer_timeout_s: float = Field(5.0, gt=0, description="Service: time limit of scoring one completion.")
    max_scorer_timeout_s: float = Field(
        60.0, gt=0, description="Service: cap on a request's own `timeout_s` (callers may ask for less or more)."
    )
    max_completions: int = Field(4096, ge=1, description="Service: most completions in one request.")
    code: CodeSandboxConfig = Field(default_factory=CodeSandboxConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
