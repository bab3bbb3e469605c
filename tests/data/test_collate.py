"""The collator's labels: the loss sees caption tokens and eos, never padding, image tokens, bos or prompt."""

import pytest
import torch
from PIL import Image

from altscale.families.blip2.collate import IGNORE_INDEX, CaptionCollator
from altscale.families.blip2.model import build_model

CAPTIONS = ["one tomato on a white plate", "three blueberries on a black plate next to a cup of coffee"]


def examples():
    return [{"image": Image.new("RGB", (96, 96), color), "text": text} for color, text in zip(["red", "blue"], CAPTIONS)]


@pytest.fixture(scope="module", params=["blip2-tiny-opt", "blip2-tiny-t5"])
def setup(request):
    torch.manual_seed(0)
    model, processor, _ = build_model(request.param)
    collator = CaptionCollator(processor, decoder_only=model.config.use_decoder_only_language_model, prompt="a photo of")
    return model.eval(), processor, collator


def caption_ids(collator, text):
    return collator.tokenizer(text, add_special_tokens=False).input_ids + [collator.tokenizer.eos_token_id]


def test_labels_are_exactly_the_caption_and_eos(setup):
    _, _, collator = setup
    batch = collator(examples())
    for row, text in zip(batch["labels"], CAPTIONS):
        assert row[row != IGNORE_INDEX].tolist() == caption_ids(collator, text)


def test_padding_and_image_tokens_never_reach_the_loss(setup):
    _, _, collator = setup
    batch = collator(examples())
    ids, labels = batch["input_ids"], batch["labels"]
    assert (ids == collator.image_token_id).sum(dim=1).tolist() == [collator.processor.num_query_tokens] * 2
    if collator.decoder_only:
        assert (labels[ids == collator.image_token_id] == IGNORE_INDEX).all()
        assert (labels[batch["attention_mask"] == 0] == IGNORE_INDEX).all()
        assert (batch["attention_mask"] == 0).any()  # the short caption really was padded
    else:
        assert (labels == IGNORE_INDEX).any(dim=1).tolist() == [True, False]  # padding of the short caption only


def test_decoder_only_labels_line_up_with_the_input_ids(setup):
    _, _, collator = setup
    if not collator.decoder_only:
        pytest.skip("the encoder-decoder labels are a separate decoder sequence")
    batch = collator(examples())
    kept = batch["labels"] != IGNORE_INDEX
    assert torch.equal(batch["labels"][kept], batch["input_ids"][kept])


def test_a_captions_loss_does_not_depend_on_the_padding_beside_it(setup):
    """The same example gives the same loss alone and in a batch padded for a longer caption."""
    model, _, collator = setup
    pair = examples()
    alone = model(**collator(pair[:1])).loss
    batch = collator(pair)
    logits = model(**batch).logits[:1]
    labels = batch["labels"][:1]
    if collator.decoder_only:
        logits, labels = logits[:, :-1], labels[:, 1:]
    padded = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    torch.testing.assert_close(alone, padded, rtol=1e-4, atol=1e-4)


def test_model_loss_is_cross_entropy_over_caption_tokens_only(setup):
    model, _, collator = setup
    batch = collator(examples())
    output = model(**batch)
    logits, labels = output.logits, batch["labels"]
    if collator.decoder_only:
        logits, labels = logits[:, :-1], labels[:, 1:]
    kept = labels != IGNORE_INDEX
    manual = torch.nn.functional.cross_entropy(logits[kept], labels[kept])
    torch.testing.assert_close(output.loss, manual, rtol=1e-4, atol=1e-4)


def test_generation_inputs_are_left_padded_for_decoder_only_models(setup):
    _, _, collator = setup
    inputs = collator.generation_inputs([Image.new("RGB", (64, 64))] * 2)
    last = inputs["input_ids"][:, -1].tolist()
    if collator.decoder_only:
        assert last == collator.tokenizer("a photo of").input_ids[-1:] * 2
    assert (inputs["input_ids"] == collator.image_token_id).sum().item() == 2 * collator.processor.num_query_tokens


def test_greyscale_rgba_and_cmyk_photos_become_rgb(setup):
    _, _, collator = setup
    images = [Image.new(mode, (40, 30)) for mode in ("L", "RGBA", "CMYK", "P")]
    assert tuple(collator.pixel_values(images).shape[:2]) == (4, 3)


def test_every_pil_mode_becomes_8_bit_rgb_with_its_content_kept():
    import numpy as np

    from altscale.data.images import to_rgb

    grey16 = Image.fromarray(np.full((4, 4), 32896, dtype=np.uint16))  # mid-grey in 16 bits: 128 after rescaling
    assert grey16.mode == "I;16" and to_rgb(grey16).getpixel((0, 0)) == (128, 128, 128)
    clear = Image.new("RGBA", (4, 4), (0, 0, 0, 0))  # fully transparent: shown on white, not black
    assert to_rgb(clear).getpixel((0, 0)) == (255, 255, 255)
    assert to_rgb(Image.new("LA", (4, 4), (10, 255))).getpixel((0, 0)) == (10, 10, 10)
    assert to_rgb(Image.new("CMYK", (4, 4), (0, 255, 255, 0))).getpixel((0, 0)) == (255, 0, 0)
    for mode in ("1", "L", "P", "PA", "I", "F", "YCbCr", "RGB"):
        assert to_rgb(Image.new(mode, (4, 4))).mode == "RGB"


def test_a_batch_of_mixed_modes_collates(setup):
    _, _, collator = setup
    modes = ("L", "LA", "P", "RGBA", "CMYK", "I;16", "RGB")
    batch = collator([{"image": Image.new(mode, (40, 30)), "text": "a plate"} for mode in modes])
    assert tuple(batch["pixel_values"].shape[:2]) == (len(modes), 3)


def test_pad_to_multiple_of_rounds_the_width_and_changes_no_label(setup):
    model, processor, collator = setup
    rounded = CaptionCollator(processor, decoder_only=model.config.use_decoder_only_language_model,
                              prompt="a photo of", pad_to_multiple_of=16)
    plain, padded = collator(examples()), rounded(examples())
    assert padded["labels"].shape[1] % 16 == 0 and padded["labels"].shape[1] >= plain["labels"].shape[1]
    for a, b in zip(plain["labels"], padded["labels"]):
        assert a[a != IGNORE_INDEX].tolist() == b[b != IGNORE_INDEX].tolist()
    assert padded["attention_mask"].sum() == plain["attention_mask"].sum()
