"""Write alt text with a fine-tuned BLIP-2: for one image, a folder of images, a dataset split, or HTML pages.

    python recipes/generate.py --model_name_or_path outputs/tiny-opt-demo --images photo.png
    python recipes/generate.py --model_name_or_path outputs/tiny-opt-demo --images photos/ --output alt.jsonl
    python recipes/generate.py --model_name_or_path outputs/tiny-opt-demo --dataset_path data/synthetic_food --split test
    python recipes/generate.py --adapter me/blip2-alt-lora --html site/ --keep_existing true
    python recipes/generate.py --model_name_or_path Salesforce/blip2-opt-2.7b --adapter outputs/opt27-lora --html page.html

Images, folders and splits give JSONL lines {"image", "alt_text"} (stdout unless --output). HTML mode
writes page.alt.html next to each page (--html_out elsewhere, --in_place over it) and reports every <img>.
"""

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)
from transformers import set_seed

from altscale.data import pages
from altscale.data.images import load_images
from altscale.data.loading import load_split
from altscale.families.blip2.captioner import (
    CaptionerArguments,
    build_collator,
    check_captioner,
    load_captioner,
    resolve_dtype,
    write_alt_text,
)
from altscale.config.arguments import Parser
from altscale.config.errors import ConfigError, DataError, run_cli

@dataclass
class SourceArguments:
    images: str | None = field(default=None, metadata={"help": "An image file or a folder of images (searched recursively)."})
    dataset_path: str | None = field(default=None, metadata={"help": "A dataset, as in recipes (save_to_disk or imagefolder)."})
    split: str = field(default="test", metadata={"help": "With --dataset_path: the split to caption."})
    num_samples: int | None = field(default=None, metadata={"help": "With --dataset_path: only the first N examples."})
    image_column: str = field(default="image", metadata={"help": "With --dataset_path: the column holding the photo."})
    text_column: str = field(default="text", metadata={"help": "With --dataset_path: the column holding the caption."})
    html: str | None = field(default=None, metadata={"help": "An HTML file or a folder of them: fill in the alt of local <img>s."})
    html_out: str | None = field(default=None, metadata={"help": "With --html: output file (or folder); default page.alt.html beside each page."})
    in_place: bool = field(default=False, metadata={"help": "With --html: overwrite the input pages."})
    keep_existing: bool = field(default=False, metadata={"help": "With --html: leave an <img> that has an alt (even alt=\"\") as it is."})
    output: str | None = field(default=None, metadata={"help": "JSONL file for the results; default stdout (HTML mode: none, or the report)."})


def parse_args(argv: list[str] | None, groups=(CaptionerArguments, SourceArguments)):
    return Parser(groups).parse_args_into_dataclasses(args=argv)


def check_sources(args: SourceArguments) -> list[str]:
    problems = []
    given = [name for name in ("images", "dataset_path", "html") if getattr(args, name)]
    if len(given) != 1:
        problems.append(f"say what to describe with exactly one of --images, --dataset_path, --html; got {given or 'none'}")
    if (args.html_out or args.in_place or args.keep_existing) and not args.html:
        problems.append("--html_out, --in_place and --keep_existing apply to --html pages only; drop them or add --html")
    if args.html_out and args.in_place:
        problems.append("--html_out and --in_place both say where pages go; keep one")
    if args.html and args.html_out and Path(args.html_out).resolve() == Path(args.html).resolve():
        problems.append(f"--html_out {args.html_out} is the input; to overwrite it say --in_place true instead")
    return problems


def write_jsonl(rows: list[dict], output: str | None) -> None:
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if output is None:
        sys.stdout.write(lines)
    else:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(lines)


def fill_pages(args: SourceArguments, describe) -> list[pages.PageImage]:
    """Fill in the alt of every local <img> under args.html; `describe(images)` writes the alt texts."""
    root = Path(args.html)
    found = pages.find_pages(root)
    planned = {page: (text := pages.read_page(page), pages.plan_page(page, text, args.keep_existing)) for page in found}
    todo = {entry.image: None for _, entries in planned.values() for entry in entries if entry.status == "done"}
    images = {path: pages.open_image(Path(path)) for path in todo}
    readable = [path for path, image in images.items() if image is not None]
    alts = dict(zip(readable, describe([images[path] for path in readable])))  # one batched pass over all pages
    report = []
    html_out = Path(args.html_out) if args.html_out else None
    for page, (text, entries) in planned.items():
        for entry in entries:
            if entry.status == "done" and entry.image not in alts:
                entry.status, entry.reason = "skipped", f"unreadable image {entry.image}"
            elif entry.status == "done":
                entry.alt_text = alts[entry.image]
        edits = [(entry.tag, entry.alt_text) for entry in entries if entry.status == "done"]
        pages.write_page(pages.output_path(page, root, html_out, args.in_place), pages.set_alt_texts(text, edits))
        report.extend(entries)
    return report


def format_report(report: list[pages.PageImage]) -> str:
    lines = [f"{e.status:7} {e.page}:{e.line} src={e.src!r}: " + (repr(e.alt_text) if e.status == "done" else e.reason) for e in report]
    counts = {status: sum(e.status == status for e in report) for status in ("done", "kept", "skipped")}
    lines.append(", ".join(f"{n} {status}" for status, n in counts.items()) + f" of {len(report)} <img> tags")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    model_args, source = parse_args(argv)
    problems = check_captioner(model_args) + check_sources(source)
    if problems:
        raise ConfigError("\n".join(problems))
    # Inputs are read before any weight is loaded, so a wrong path fails in a second, not after the model loads.
    names, images, references = [], [], None
    if source.html:
        pages.find_pages(Path(source.html))
    elif source.images:
        names, images, problems = load_images(Path(source.images))
        for problem in problems:
            print(problem, file=sys.stderr)
    else:
        names, images, references = load_split(source.dataset_path, source.split, source.num_samples,
                                               image_column=source.image_column, text_column=source.text_column)
    set_seed(model_args.seed)
    model, processor, described = load_captioner(
        model_args.model_name_or_path, adapter=model_args.adapter,
        processor_name_or_path=model_args.processor_name_or_path, dtype=resolve_dtype(model_args.dtype),
        load_in_4bit=model_args.load_in_4bit,
    )
    print(f"model: {described}", file=sys.stderr)
    collator = build_collator(model, processor, model_args.prompt)

    def describe(images: list) -> list[str]:
        return write_alt_text(model, collator, images, max_chars=model_args.max_alt_chars, max_new_tokens=model_args.max_new_tokens,
                              num_beams=model_args.num_beams, batch_size=model_args.batch_size)

    if source.html:
        report = fill_pages(source, describe)
        print(format_report(report), file=sys.stderr)
        rows = [{k: v for k, v in asdict(e).items() if k != "tag"} for e in report]
        if source.output is not None:  # the pages are the output; the report goes to stderr above
            write_jsonl(rows, source.output)
        return rows
    rows = [{"image": name, "alt_text": alt} for name, alt in zip(names, describe(images))]
    if references is not None:
        for row, reference in zip(rows, references):
            row["reference"] = reference
    write_jsonl(rows, source.output)
    return rows


def run(argv: list[str] | None = None) -> int:
    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(run())
