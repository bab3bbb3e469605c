"""Alt text length and the captioner's loading messages."""

import pytest

from altscale.families.blip2.captioner import load_captioner, resolve_dtype, trim_alt_text
from altscale.config.errors import ConfigError


def test_alt_text_is_cut_at_a_word_boundary_and_never_empty():
    long = "two lemons on a blue plate, " * 10
    trimmed = trim_alt_text(long, 125)
    assert len(trimmed) <= 125 and long.startswith(trimmed) and not trimmed.endswith((",", " "))
    assert long[len(trimmed)] in " ,"  # the cut falls between words
    assert trim_alt_text("  two\n lemons  ") == "two lemons"
    assert trim_alt_text("   ") == "image"
    assert trim_alt_text("x" * 200, 20) == "x" * 20  # one word longer than the limit is cut hard
    assert trim_alt_text("exactly twenty chars", 20) == "exactly twenty chars"


def test_dtype_names():
    assert str(resolve_dtype("bfloat16")) == "torch.bfloat16"
    assert str(resolve_dtype("auto")) == "torch.float32"  # on the CPU
    with pytest.raises(ConfigError, match="dtype: 'fp8' is unknown"):
        resolve_dtype("fp8")


def test_adapter_messages(tmp_path):
    with pytest.raises(ConfigError, match="adapter: cannot read"):
        load_captioner(None, adapter=str(tmp_path))
    with pytest.raises(ConfigError, match="model_name_or_path: not given"):
        load_captioner(None)
