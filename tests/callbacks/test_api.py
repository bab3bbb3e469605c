"""The API list in callbacks/__init__.py's docstring says what the code takes: each listed signature is checked."""

import inspect
import re

import altscale.callbacks as callbacks

LISTED = re.compile(r"^    (\w+)\((.*?)\)(?: ->|$)", re.M | re.S)


def listed_signatures() -> dict[str, list[str]]:
    api = callbacks.__doc__.split("Public API", 1)[1]
    found = {}
    for name, params in LISTED.findall(api):
        found[name] = [word.split("=")[0].strip() for word in params.replace("\n", " ").split(",") if word.strip()]
    return found


def test_every_listed_function_exists_with_the_listed_parameters():
    listed = listed_signatures()
    assert len(listed) >= 12, listed
    for name, params in listed.items():
        function = getattr(callbacks, name)
        actual = list(inspect.signature(function).parameters)
        expected = [p for p in params if p != "*"]
        assert actual == expected, f"{name}: listed ({', '.join(params)}), code {actual}"


def test_every_public_name_is_listed():
    listed = listed_signatures()
    functions = [name for name in callbacks.__all__ if inspect.isfunction(getattr(callbacks, name))]
    assert sorted(set(functions) - set(listed)) == []
