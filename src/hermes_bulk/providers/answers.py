"""What an answer must be before it is kept: the shape of a chat-completions body, and for
`--schema` jobs, the user's JSON schema (checked with jsonschema, at create and on every answer).

Also the schema a provider is sent: OpenAI's strict mode accepts only schemas whose objects all
have `additionalProperties: false` and list every property as required, in a subset of JSON
Schema. `strict_form` gives that form where it keeps every answer valid under the user's schema,
else None, and the request then goes without strict (docs/decisions.md, "Answers we accept").

Messages are our own words and a JSON path (`$.items[2].label`), never the answer's text: an
answer can be megabytes, and a provider's text stays out of job records (DESIGN.md inv. 7).
jsonschema is imported on first use: `status` and `list` start without it.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ..errors import InvalidAnswer

#: The response_format name of a --schema request.
SCHEMA_NAME = "item_result"

#: What a chat-completions body must be for its first choice to be read (extra fields are
#: ignored; `usage`'s counts are read leniently by model.token_count).
CHAT_COMPLETION: dict[str, Any] = {
    "type": "object",
    "required": ["choices"],
    "properties": {
        "choices": {
            "type": "array",
            "minItems": 1,
            "prefixItems": [
                {
                    "type": "object",
                    "required": ["message"],
                    "properties": {
                        "message": {
                            "type": "object",
                            "properties": {
                                "content": {"type": ["string", "null"]},
                                "refusal": {"type": ["string", "null"]},
                            },
                        },
                        "finish_reason": {"type": ["string", "null"], "maxLength": 64},
                    },
                }
            ],
        },
        "usage": {"type": ["object", "null"]},
        "model": {"type": ["string", "null"], "maxLength": 200},
    },
}

#: Keywords OpenAI's strict mode accepts (its documented subset of JSON Schema).
_STRICT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "definitions",
        "description",
        "title",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)
#: Annotations with no effect on which answers are valid: left out of the strict form.
_ANNOTATIONS = frozenset(
    {"$schema", "$comment", "default", "examples", "deprecated", "readOnly", "writeOnly"}
)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot be used to check answers (one line), or None when it can: it must be
    a valid JSON schema under the draft it names (2020-12 when it names none), and every $ref
    must point inside it (nothing is fetched while answers are checked)."""
    from jsonschema import exceptions, validators
    from referencing import Registry, Resource
    from referencing import exceptions as ref_errors
    from referencing.jsonschema import DRAFT202012

    if not isinstance(schema.get("$schema", ""), str):
        return "its $schema is not a URI"
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except exceptions.SchemaError as exc:
        return f"not a valid JSON schema at {_path(exc.absolute_path)}: {_one_line(exc.message)}"
    except RecursionError:
        return "not a valid JSON schema: it is nested too deeply"
    here = "urn:hermes-bulk:schema"
    resolver = (
        Registry()
        .with_resource(here, Resource.from_contents(schema, default_specification=DRAFT202012))
        .resolver(here)
    )
    for ref in _refs(schema):
        if not ref.startswith("#"):
            return (
                f"the $ref {_one_line(ref)} points outside the file; keep every definition in "
                "it ($defs)"
            )
        try:
            resolver.lookup(ref)
        except ref_errors.Unresolvable:
            return f"the $ref {_one_line(ref)} points at nothing in the file"
    return None


def strict_form(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The schema as strict mode wants it, or None when strict mode cannot say the same thing.

    Every object gets `additionalProperties: false` and all its properties in `required`: an
    answer strict mode allows is then always valid under the user's schema (a property left
    optional is always given). None when an object allows other properties (additionalProperties
    true or a schema, patternProperties, or no properties listed), requires a name it does not
    list, or a keyword outside strict mode's subset is used (allOf, oneOf, not, if/then,
    minLength, uniqueItems …). Annotations ($schema, default, examples …) are left out.
    """
    out = _strict(schema)
    if out is not None:
        out.setdefault("type", "object")
    return out


def _strict(node: Any) -> dict[str, Any] | None:
    if not isinstance(node, dict):  # true/false schemas have no strict form
        return None
    node = {key: value for key, value in node.items() if key not in _ANNOTATIONS}
    if not node.keys() <= _STRICT_KEYWORDS or not _close(node):
        return None
    for key in ("properties", "$defs", "definitions", "anyOf", "items"):
        if key in node:
            node[key] = _strict(node[key]) if key == "items" else _strict_each(node[key])
            if node[key] is None:
                return None
    return node


def _close(node: dict[str, Any]) -> bool:
    """Make an object schema closed (no other properties, all required); False if it cannot be."""
    kinds = node.get("type")
    if not (
        kinds == "object" or (isinstance(kinds, list) and "object" in kinds) or "properties" in node
    ):
        return True
    props, required = node.get("properties"), node.get("required", [])
    if (
        not isinstance(props, dict)
        or not props
        or node.get("additionalProperties", False) is not False
    ):
        return False
    if not isinstance(required, list) or not all(
        isinstance(n, str) and n in props for n in required
    ):
        return False  # a required name with no schema: strict mode cannot ask for it
    node["additionalProperties"], node["required"] = False, list(props)
    return True


def _strict_each(subs: Any) -> dict[str, Any] | list[Any] | None:
    """Each subschema of a dict (properties, $defs) or list (anyOf) in strict form, or None."""
    if isinstance(subs, dict):
        named = {name: _strict(sub) for name, sub in subs.items()}
        return None if None in named.values() else named
    if isinstance(subs, list):
        listed = [_strict(sub) for sub in subs]
        return None if None in listed else listed
    return None


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The request's response_format for a --schema job: strict when strict_form allows it, else
    the user's schema as given, without strict (the answer is still checked here)."""
    return json.loads(_response_format_text(json.dumps(schema)))


@functools.lru_cache(maxsize=64)
def _response_format_text(schema_text: str) -> str:
    """Once per schema, not per request (a copy comes back: a caller may change its body)."""
    schema = json.loads(schema_text)
    strict = strict_form(schema)
    return json.dumps(
        {
            "type": "json_schema",
            "json_schema": {
                "name": SCHEMA_NAME,
                "schema": schema if strict is None else strict,
                "strict": strict is not None,
            },
        }
    )


def loads(text: str | bytes, what: str) -> Any:
    """JSON text as data; InvalidAnswer when it is not JSON, nests past the parser's depth, or
    gives one key twice (parsers disagree on which one counts, so neither is believed)."""
    try:
        return json.loads(text, object_pairs_hook=_one_value_per_key)
    except _DuplicateKey:
        raise InvalidAnswer(f"{what} gives a key twice", http_status=200) from None
    except (ValueError, RecursionError):
        raise InvalidAnswer(f"{what} is not JSON", http_status=200) from None


class _DuplicateKey(ValueError):
    pass


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey()
    return out


def check_answer(data: Any, schema_text: str) -> None:
    """Raise InvalidAnswer unless `data` is valid under the job's schema (its JSON text)."""
    _check(_validator(schema_text), data, "the answer does not match --schema")


def check_completion_body(data: Any) -> None:
    """Raise InvalidAnswer unless `data` is a chat-completions body we can read."""
    if plainly_valid(data):  # every well-formed answer, spared jsonschema's walk (it holds the GIL)
        return
    _check(_validator(_CHAT_COMPLETION_TEXT), data, "the provider's answer is malformed")


def plainly_valid(data: Any) -> bool:
    """CHAT_COMPLETION's rules in plain Python: True only for a body that schema accepts (a
    property test holds the two together); False sends the body to jsonschema for the verdict."""
    if not isinstance(data, dict):
        return False
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    message, finish = choices[0].get("message"), choices[0].get("finish_reason")
    return (
        isinstance(message, dict)
        and _text_or_none(message.get("content"))
        and _text_or_none(message.get("refusal"))
        and _text_or_none(finish, 64)
        and (data.get("usage") is None or isinstance(data["usage"], dict))
        and _text_or_none(data.get("model"), 200)
    )


def _text_or_none(value: Any, longest: int | None = None) -> bool:
    return value is None or (isinstance(value, str) and (longest is None or len(value) <= longest))


_CHAT_COMPLETION_TEXT = json.dumps(CHAT_COMPLETION)


def _check(validator: Any, data: Any, what: str) -> None:
    from jsonschema import exceptions

    try:
        if validator.is_valid(data):
            return
        error = exceptions.best_match(validator.iter_errors(data))
    except RecursionError:  # nested thousands deep: no answer we asked for looks like that
        raise InvalidAnswer(f"{what}: it is nested too deeply", http_status=200) from None
    raise InvalidAnswer(
        f"{what}: {_path(error.absolute_path)} {_in_our_words(error)}", http_status=200
    )


@functools.lru_cache(maxsize=64)
def _validator(schema_text: str) -> Any:
    from jsonschema import validators

    schema = json.loads(schema_text)
    return validators.validator_for(schema, default=validators.Draft202012Validator)(schema)


def _in_our_words(error: Any) -> str:
    """What is wrong, from the schema's side only (the rule and its value), never the answer's."""
    rule, wanted = error.validator, error.validator_value
    if rule == "type":
        kinds = wanted if isinstance(wanted, list) else [wanted]
        return "is not " + " or ".join(_A.get(k, str(k)) for k in kinds)
    if rule == "required":
        present = error.instance.keys() if isinstance(error.instance, dict) else ()
        missing = [name for name in wanted if name not in present]
        return f"lacks {_one_line(', '.join(missing) or 'a required property')}"
    if rule == "minItems" and wanted == 1:
        return "is empty"
    if rule in ("enum", "const"):
        return "is not one of the values the schema allows"
    if rule in ("additionalProperties", "unevaluatedProperties"):
        return "has a property the schema does not allow"
    if rule in (
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minProperties",
        "maxProperties",
    ):
        return f"breaks {rule} {_one_line(json.dumps(wanted))}"
    return f"breaks the schema's {_one_line(str(rule))} rule"


_A = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}

_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")


def _path(parts: Any) -> str:
    """A JSON path; a key that is not a short plain name is shown by position only ([…])."""
    out = "$"
    for part in list(parts)[:12]:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if _PLAIN_NAME.match(str(part)) else "[…]"
    return out


def _one_line(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refs(node: Any):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)
