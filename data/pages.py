"""Find the <img> tags of an HTML page and rewrite their alt attributes, leaving every other byte as it was.

Tags are found by python's html.parser (so nothing inside comments, scripts or styles counts); each
tag's position in the original text comes from the parser (getpos, get_starttag_text), and the edit
replaces only the alt attribute's span inside that tag, or inserts one after the last attribute.
"""

from dataclasses import dataclass, field
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


from altscale.data.images import open_image  # noqa: F401  (pages.open_image: an <img>'s picture)
from altscale.config.errors import DataError

HTML_SUFFIXES = (".html", ".htm")
OUTPUT_SUFFIX = ".alt"  # page.html -> page.alt.html; such files are outputs, never inputs
_SPACE = " \t\n\r\f"


@dataclass
class ImgTag:
    """One <img> start tag: where it is in the page text, its attributes, and where an alt goes."""

    start: int
    end: int
    line: int
    attrs: dict
    alt_span: tuple[int, int] | None  # the whole `alt=...` attribute, as offsets in the page text
    insert_at: int  # where a new ` alt="..."` goes when there is none


@dataclass
class PageImage:
    """What happened to one <img> of one page, for the report."""

    page: str
    line: int
    src: str | None
    status: str  # done, kept or skipped
    reason: str = ""
    image: str | None = None
    alt_text: str | None = None
    previous_alt: str | None = None
    tag: ImgTag | None = field(default=None, repr=False)


class _ImgFinder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found = []

    def handle_starttag(self, tag, attrs):  # html.parser also calls this for <img ... />
        if tag == "img":
            self.found.append((self.getpos(), self.get_starttag_text(), attrs))


def read_page(path: Path) -> str:
    # surrogateescape keeps bytes that are not UTF-8 (a latin-1 page) and writes them back unchanged;
    # no newline translation, so CRLF pages stay CRLF.
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


def write_page(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))


def attribute_spans(tag_text: str) -> list[tuple[str, int, int]]:
    """(lower-cased name, start, end) of each attribute in a start tag's text, following HTML's attribute syntax."""
    i, n, spans = 1, len(tag_text), []
    while i < n and tag_text[i] not in _SPACE + "/>":
        i += 1  # the tag name
    while True:
        while i < n and tag_text[i] in _SPACE + "/":
            i += 1
        if i >= n or tag_text[i] == ">":
            return spans
        start = i
        i += 1  # a name may begin with "=" in HTML; anything else up to space, "/", ">" or "=" continues it
        while i < n and tag_text[i] not in _SPACE + "/>=":
            i += 1
        name, end = tag_text[start:i].lower(), i
        j = i
        while j < n and tag_text[j] in _SPACE:
            j += 1
        if j < n and tag_text[j] == "=":
            j += 1
            while j < n and tag_text[j] in _SPACE:
                j += 1
            if j < n and tag_text[j] in "\"'":
                close = tag_text.find(tag_text[j], j + 1)
                j = n - 1 if close < 0 else close + 1
            else:
                while j < n and tag_text[j] not in _SPACE + ">":
                    j += 1
            i = end = j
        spans.append((name, start, end))


def find_img_tags(text: str) -> list[ImgTag | None]:
    """Every <img> the parser sees; None for one whose attributes could not be located (left untouched)."""
    finder = _ImgFinder()
    finder.feed(text)
    finder.close()
    line_starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    tags = []
    for (line, column), tag_text, attrs in finder.found:
        start = line_starts[line - 1] + column
        spans = attribute_spans(tag_text)
        if text[start : start + len(tag_text)] != tag_text or [s[0] for s in spans] != [a[0] for a in attrs]:
            tags.append(None)  # our own invariant failed; never edit what we cannot place exactly
            continue
        alt = next(((start + s, start + e) for name, s, e in spans if name == "alt"), None)
        insert_at = start + (spans[-1][2] if spans else len("<img"))
        first = {}
        for name, value in attrs:
            first.setdefault(name, value)  # browsers use the first of repeated attributes
        tags.append(ImgTag(start, start + len(tag_text), line, first, alt, insert_at))
    return tags


def resolve_src(src: str | None, page: Path) -> tuple[Path | None, str]:
    """The local image file a src points at, relative to the page, or None and the reason."""
    if src is None or not src.strip():
        return None, "no src attribute"
    parts = urlsplit(src.strip())
    if parts.scheme == "data":
        return None, "inline data: URI"
    if parts.scheme or parts.netloc:
        return None, f"remote URL ({parts.scheme or 'protocol-relative'})"
    if parts.path.startswith("/"):
        return None, "root-relative src: the site root is unknown; make it relative to the page"
    path = page.parent / unquote(parts.path)
    if not path.is_file():
        return None, f"missing file {path}"
    return path, ""


def set_alt_texts(text: str, edits: list[tuple[ImgTag, str]]) -> str:
    """The page with each tag's alt set; the text outside the alt spans is kept exactly."""
    for tag, alt in sorted(edits, key=lambda edit: edit[0].start, reverse=True):
        attribute = f'alt="{escape(alt, quote=True)}"'
        if tag.alt_span is not None:
            text = text[: tag.alt_span[0]] + attribute + text[tag.alt_span[1] :]
        else:
            text = text[: tag.insert_at] + " " + attribute + text[tag.insert_at :]
    return text


def find_pages(path: Path) -> list[Path]:
    """The page itself, or every .html/.htm under a folder (outputs named *.alt.html left out)."""
    if not path.exists():
        raise DataError(f"html: {path} does not exist; give an HTML file or a folder of them")
    if path.is_file():
        if path.suffix.lower() not in HTML_SUFFIXES:
            raise DataError(f"html: {path} is not an .html or .htm file; give an HTML page or a folder of them")
        return [path]
    pages = sorted(p for p in path.rglob("*") if p.suffix.lower() in HTML_SUFFIXES and not p.stem.endswith(OUTPUT_SUFFIX) and p.is_file())
    if not pages:
        raise DataError(f"html: folder {path} holds no .html or .htm files (outside *{OUTPUT_SUFFIX}.html outputs)")
    return pages


def output_path(page: Path, root: Path, html_out: Path | None, in_place: bool) -> Path:
    """Where the filled page goes: next to it as page.alt.html, under html_out, or over it with in_place."""
    if in_place:
        return page
    if html_out is None:
        return page.with_name(page.stem + OUTPUT_SUFFIX + page.suffix)
    if root.is_file():
        return html_out / page.name if html_out.is_dir() else html_out
    return html_out / page.relative_to(root)


def plan_page(page: Path, text: str, keep_existing: bool) -> list[PageImage]:
    """What to do with each <img> of one page; 'done' entries still need their alt text."""
    entries = []
    for tag in find_img_tags(text):
        if tag is None:
            entries.append(PageImage(str(page), 0, None, "skipped", "attributes could not be located exactly"))
            continue
        src, previous = tag.attrs.get("src"), tag.attrs.get("alt")
        entry = PageImage(str(page), tag.line, src, "done", previous_alt=previous, tag=tag)
        if tag.alt_span is not None and keep_existing:
            entry.status, entry.reason = "kept", "alt already present and --keep_existing" + (" (empty: marks it decorative)" if not previous else "")
        else:
            image, reason = resolve_src(src, page)
            entry.image = str(image) if image else None
            if image is None:
                entry.status, entry.reason = "skipped", reason
        entries.append(entry)
    return entries
