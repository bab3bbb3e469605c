"""An offline stand-in for the OPT and Flan-T5 tokenizers, for machines that cannot reach the Hub.

It is a byte-level BPE trained on `tokenizers/corpus.txt`, so it can encode any text (no unknown
tokens), while caption words stay single tokens. Special tokens sit at the ids the real tokenizers
use (OPT: <s>=0, <pad>=1, </s>=2, <unk>=3; T5: <pad>=0, </s>=1, <unk>=2), and `<image>` is last.
The saved files are kept in the repo; `python -m altscale.models.tokenizer` writes them again.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

TOKENIZER_DIR = Path(__file__).parent / "tokenizers"
CORPUS_FILE = TOKENIZER_DIR / "corpus.txt"
VOCAB_SIZE = 1000  # fits the tiny presets' 1024-row embedding; the real presets have far more rows
IMAGE_TOKEN = "<image>"

# Listed in id order. OPT's tokenizer names </s> as its bos token too; <s> only holds id 0.
RESERVED_TOKENS = {"opt": ["<s>", "<pad>", "</s>", "<unk>"], "t5": ["<pad>", "</s>", "<unk>"]}
SPECIAL_TOKENS = {
    "opt": {"bos_token": "</s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
    "t5": {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
}


def train_tokenizer(family: str, corpus: list[str]) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE for one language-model family on caption-like text."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 1,  # the last id is kept for <image>
        special_tokens=RESERVED_TOKENS[family],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    eos = SPECIAL_TOKENS[family]["eos_token"]
    if family == "opt":
        # OPT prepends </s> as its beginning-of-sequence token and appends nothing.
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{eos} $A", pair=f"{eos} $A {eos} $B", special_tokens=[(eos, bpe.token_to_id(eos))]
        )
    else:
        # T5 appends </s> to every sequence.
        bpe.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, bpe.token_to_id(eos))]
        )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **SPECIAL_TOKENS[family])
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tokenizer.padding_side = "right"
    return tokenizer


def load_offline_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The tokenizer kept in the repo for `family` ("opt" or "t5")."""
    return PreTrainedTokenizerFast.from_pretrained(TOKENIZER_DIR / family)


def corpus_lines() -> list[str]:
    lines = CORPUS_FILE.read_text().splitlines()
    # Repeating each line weights whole words over fragments, so caption words end up as one token.
    return [line for line in lines if line.strip()] * 20


def main() -> None:
    for family in SPECIAL_TOKENS:
        tokenizer = train_tokenizer(family, corpus_lines())
        tokenizer.save_pretrained(TOKENIZER_DIR / family)
        print(f"wrote {TOKENIZER_DIR / family} ({len(tokenizer)} tokens)")


if __name__ == "__main__":
    main()
