"""The lab-format synthetic photos that BLIP-2 speed is measured on: 512x384 JPEGs with captions of 8-25 words."""

import random

from altscale.data.synthetic import describe, describe_long, make_synthetic_dataset, sample_attributes


def test_lab_photos_are_512x384_jpegs_with_8_to_25_word_captions(tmp_path):
    dataset = make_synthetic_dataset(tmp_path / "lab", num_train=24, num_test=4, seed=5, lab=True)
    for split in ("train", "test"):
        for example in dataset[split]:
            assert (example["image"].format, example["image"].size) == ("JPEG", (512, 384))
            assert 8 <= len(example["text"].split()) <= 25, example["text"]


def test_a_long_caption_starts_with_the_short_one_and_names_the_table():
    rng = random.Random(0)
    for _ in range(50):
        attrs = sample_attributes(rng)
        caption = describe_long(attrs, rng)
        assert caption.startswith(describe(attrs) + " resting on ")
        assert {"wood": "wooden", "gray": "stone", "pink": "tablecloth"}[attrs["table"]] in caption
