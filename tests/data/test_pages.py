"""HTML pages: <img> tags found by the parser, alt spans rewritten, every other byte kept."""

from pathlib import Path

import pytest

from altscale.data import pages
from altscale.config.errors import DataError

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_page" / "index.html"


def edit_all(text: str, alt: str = "new") -> str:
    return pages.set_alt_texts(text, [(tag, alt) for tag in pages.find_img_tags(text)])


def test_alt_is_inserted_or_replaced_and_nothing_else_moves():
    page = ('<p>a <img src="a.png"> b <IMG SRC=b.png ALT=old width=3> c\n<img\n  alt=\'x\'\n  src="c.png" />'
            '<img src="d.png" alt><img src="e.png"/></p>')
    assert edit_all(page, 'Two "lemons" & <one> tomato') == (
        '<p>a <img src="a.png" alt="Two &quot;lemons&quot; &amp; &lt;one&gt; tomato"> b '
        '<IMG SRC=b.png alt="Two &quot;lemons&quot; &amp; &lt;one&gt; tomato" width=3> c\n<img\n'
        '  alt="Two &quot;lemons&quot; &amp; &lt;one&gt; tomato"\n  src="c.png" />'
        '<img src="d.png" alt="Two &quot;lemons&quot; &amp; &lt;one&gt; tomato">'
        '<img src="e.png" alt="Two &quot;lemons&quot; &amp; &lt;one&gt; tomato"/></p>'
    )


def test_comments_scripts_and_styles_are_not_tags():
    page = '<!-- <img src="a.png"> --><script>"<img src=b.png>"</script><style>/* <img src=c.png> */</style><img src="d.png">'
    tags = pages.find_img_tags(page)
    assert [tag.attrs["src"] for tag in tags] == ["d.png"]
    assert edit_all(page) == page.replace('<img src="d.png">', '<img src="d.png" alt="new">')


def test_crlf_and_non_utf8_bytes_survive(tmp_path):
    raw = b'<p>caf\xe9\r\n<img src="a.png"\r\n alt="">\r\n</p>\r\n'  # latin-1, CRLF
    (tmp_path / "in.html").write_bytes(raw)
    text = pages.read_page(tmp_path / "in.html")
    pages.write_page(tmp_path / "out.html", edit_all(text))
    assert (tmp_path / "out.html").read_bytes() == raw.replace(b'alt=""', b'alt="new"')


def test_sample_page_plan(tmp_path):
    entries = pages.plan_page(SAMPLE, pages.read_page(SAMPLE), keep_existing=False)
    reasons = {entry.src: (entry.status, entry.reason.split(" ")[0]) for entry in entries}
    assert reasons["https://example.com/photos/soup.jpg"] == ("skipped", "remote")
    assert reasons["images/salad.png"] == ("skipped", "missing")
    assert reasons["data:image/gif;base64,R0lGODlhAQABAAAAACw="] == ("skipped", "inline")
    assert reasons["images/broccoli.png?v=2"] == ("done", "")  # the query string is not part of the file name
    kept = [e for e in pages.plan_page(SAMPLE, pages.read_page(SAMPLE), keep_existing=True) if e.status == "kept"]
    assert [e.previous_alt for e in kept] == ["IMG_0412.png", "", "Two broccoli florets on a white plate, freshly steamed"]


@pytest.mark.parametrize("src, reason", [(None, "no src"), ("", "no src"), ("//cdn.example/a.png", "remote"),
                                         ("/img/a.png", "root-relative"), ("nothere.png", "missing")])
def test_srcs_that_are_not_local_files_say_why(tmp_path, src, reason):
    path, why = pages.resolve_src(src, tmp_path / "page.html")
    assert path is None and why.startswith(reason)


def test_unreadable_image_is_none(tmp_path):
    (tmp_path / "fake.png").write_text("not a png")
    assert pages.open_image(tmp_path / "fake.png") is None


def test_find_pages_messages(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        pages.find_pages(tmp_path / "missing.html")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="not an .html or .htm file"):
        pages.find_pages(tmp_path / "notes.txt")
    (tmp_path / "old.alt.html").write_text("<img src=a.png>")
    with pytest.raises(DataError, match="holds no .html or .htm files"):
        pages.find_pages(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.htm").write_text("")
    assert pages.find_pages(tmp_path) == [tmp_path / "sub" / "b.htm"]


def test_output_never_overwrites_the_input_unless_asked(tmp_path):
    page = tmp_path / "site" / "index.html"
    page.parent.mkdir()
    page.write_text("<img src=a.png>")
    assert pages.output_path(page, page, None, in_place=False) == tmp_path / "site" / "index.alt.html"
    assert pages.output_path(page, page, None, in_place=True) == page
    assert pages.output_path(page, tmp_path / "site", tmp_path / "out", in_place=False) == tmp_path / "out" / "index.html"
    assert pages.output_path(page, page, tmp_path, in_place=False) == tmp_path / "index.html"  # an existing folder
