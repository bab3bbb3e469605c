import pytest
from PIL import Image

from altscale.data.synthetic import caption_vocabulary
from altscale.families import random_init_config
from altscale.families.blip2.processor import build_offline_processor
from altscale.models.tokenizer import SPECIAL_TOKENS, corpus_lines, load_offline_tokenizer, train_tokenizer


@pytest.mark.parametrize("family", ["opt", "t5"])
def test_saved_tokenizer_is_what_the_corpus_trains(family):
    saved, fresh = load_offline_tokenizer(family), train_tokenizer(family, corpus_lines())
    assert saved.get_vocab() == fresh.get_vocab()


def test_special_tokens_sit_where_the_real_tokenizers_put_them():
    opt, t5 = load_offline_tokenizer("opt"), load_offline_tokenizer("t5")
    assert (opt.pad_token_id, opt.bos_token_id, opt.eos_token_id, opt.unk_token_id) == (1, 2, 2, 3)
    assert (t5.pad_token_id, t5.eos_token_id, t5.unk_token_id) == (0, 1, 2)
    assert opt("a plate").input_ids[0] == 2  # OPT prepends </s>
    assert t5("a plate").input_ids[-1] == 1  # T5 appends </s>


@pytest.mark.parametrize("family", list(SPECIAL_TOKENS))
def test_every_caption_word_is_one_token_and_round_trips(family):
    tokenizer = load_offline_tokenizer(family)
    for word in caption_vocabulary():
        assert len(tokenizer(" " + word, add_special_tokens=False).input_ids) == 1, word
    text = "Crème brûlée 🍮 on a plate"  # anything decodes back: byte-level BPE has no unknown token
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids).strip() == text


def test_offline_processor_expands_32_image_tokens_for_real_presets(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    processor = build_offline_processor(random_init_config("blip2-opt-2.7b"))
    batch = processor(images=[Image.new("RGB", (300, 200))], text=["a plate"], return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert (batch["input_ids"] == image_id).sum().item() == 32
    assert tuple(batch["pixel_values"].shape) == (1, 3, 224, 224)
