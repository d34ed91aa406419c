"""A msgspec decoder for protocol v1, derived from the TypedDicts of server/protocol.py.

server/protocol.py stays the one definition of the wire format (its JSON Schema is the
public contract and the OpenAPI body). Ingest decodes every accepted body with msgspec, which
builds the same plain dicts about twice as fast as pydantic-core (docs/performance.md), so the
shapes are translated here, constraint by constraint, once at import. A constraint this module
does not know how to translate fails the import: the two validators can never quietly drift
apart. Rejected bodies are validated again by pydantic, whose error list names every bad field
(server/ingest/decode.py); tests/server/test_protocol_decoder.py holds the two to the same verdicts.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from typing import Annotated, Any, Callable, Literal, Union

import annotated_types
import msgspec
from pydantic.fields import FieldInfo
from typing_extensions import NotRequired, TypedDict, is_typeddict

from server.protocol import DEFAULT_CLUSTER, PRINTABLE, Batch, SampleIn

# Absent keys that mean something other than null ([] and {} come from the key's type). An
# absent `workload` (an older agent) is UNSET, not null (unknown): nothing is stored for it.
STRUCT_DEFAULTS: dict[str, Any] = {"lost": False, "cluster": DEFAULT_CLUSTER, "workload": msgspec.UNSET}

# pydantic constraint (annotated_types) -> msgspec.Meta keyword.
_CONSTRAINTS: dict[type, tuple[str, str]] = {
    annotated_types.Ge: ("ge", "ge"),
    annotated_types.Gt: ("gt", "gt"),
    annotated_types.Le: ("le", "le"),
    annotated_types.Lt: ("lt", "lt"),
    annotated_types.MinLen: ("min_length", "min_length"),
    annotated_types.MaxLen: ("max_length", "max_length"),
}


class UntranslatableConstraint(TypeError):
    """protocol.py uses a constraint or type this module cannot carry over to msgspec."""


def derive(tp: Any, _done: dict[type, type] | None = None, *, structs: bool = False, holds: frozenset[str] = frozenset()) -> Any:
    """The msgspec equivalent of a protocol type: TypedDicts stay dicts, or with structs=True
    become msgspec Structs (attribute access, absent keys at their defaults, never tracked by
    the cyclic GC) and lists tuples, except TypedDicts whose every key is optional, which are
    stored whole as JSON. `holds`: patterns the caller knows every string of the input to match, left unchecked."""
    done = {} if _done is None else _done
    again = functools.partial(derive, _done=done, structs=structs, holds=holds)
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *extras = typing.get_args(tp)
        return Annotated[again(base), _meta(extras, holds)]
    if origin in (Union, types.UnionType):
        return Union[tuple(again(a) for a in typing.get_args(tp))]
    if origin is list:
        item = again(typing.get_args(tp)[0])
        # As structs, arrays are tuples: an empty one is a shared constant, not one more object
        # for the cyclic GC to walk (64,000 empty `xids` lists in the largest body: issue #12).
        return tuple[item, ...] if structs else list[item]
    if origin is dict:
        key, value = typing.get_args(tp)
        return dict[again(key), again(value)]
    if origin is Literal or tp in (int, float, str, bool, type(None)):
        return tp
    if is_typeddict(tp):
        if structs and td_has_required_keys(tp):
            return _struct(tp, done, again)
        return _typeddict(tp, done, again, structs=structs)
    raise UntranslatableConstraint(f"no msgspec translation for {tp!r}")


def td_has_required_keys(td: type) -> bool:
    # total=False: every key optional (AgentInfo), a record stored whole as JSON.
    return td.__total__


def _hints(td: type) -> dict[str, Any]:
    return typing.get_type_hints(td, include_extras=True)


def _fields(td: type, again: Callable[[Any], Any]) -> list[tuple[str, Any, bool]]:
    """(name, msgspec type, optional) per key of a protocol TypedDict."""
    _check_config(td)
    out = []
    for name, hint in _hints(td).items():
        # Under `from __future__ import annotations` the class's own key sets miss
        # NotRequired (it hides in a string); the resolved hint still carries it.
        optional = name in td.__optional_keys__ or typing.get_origin(hint) is NotRequired
        if typing.get_origin(hint) is NotRequired:
            hint = typing.get_args(hint)[0]
        out.append((name, again(hint), optional))
    return out


def _struct(td: type, done: dict, again: Callable[[Any], Any]) -> type:
    key = ("struct", td)
    if key not in done:
        fields = []
        for name, derived, optional in _fields(td, again):
            fields.append((name, derived, _default(name, derived)) if optional else (name, derived))
        done[key] = msgspec.defstruct(td.__name__, fields, kw_only=True, gc=False)
    return done[key]


def _default(name: str, derived: Any) -> Any:
    """What an absent optional key means (the defaults protocol.py names in its comments)."""
    if name in STRUCT_DEFAULTS:
        return STRUCT_DEFAULTS[name]
    origin = typing.get_origin(derived)
    if origin is Annotated:
        origin = typing.get_origin(typing.get_args(derived)[0])
    if origin is tuple:
        return ()
    if origin in (list, dict):
        return msgspec.field(default_factory=origin)
    return None


def _typeddict(td: type, done: dict, again: Callable[[Any], Any], *, structs: bool) -> type:
    key = ("dict", td, structs)
    if key not in done:
        fields = {name: NotRequired[derived] if optional else derived for name, derived, optional in _fields(td, again)}
        done[key] = TypedDict(td.__name__, fields)
    return done[key]


# msgspec's own behaviour: exact types (no "5" for 5), finite numbers only, unknown keys ignored.
_MSGSPEC_SEMANTICS = {"strict": True, "allow_inf_nan": False, "extra": "ignore"}


def _check_config(td: type) -> None:
    config = getattr(td, "__pydantic_config__", {})
    if any(config.get(k) != v for k, v in _MSGSPEC_SEMANTICS.items()):
        raise UntranslatableConstraint(f"{td.__name__}: config {config} differs from msgspec's {_MSGSPEC_SEMANTICS}")


def _meta(extras: list[Any], holds: frozenset[str] = frozenset()) -> msgspec.Meta:
    kwargs: dict[str, Any] = {}
    for extra in extras:
        for constraint in extra.metadata if isinstance(extra, FieldInfo) else [extra]:
            if _is_pattern(constraint):
                if constraint.pattern not in holds:
                    kwargs["pattern"] = python_pattern(constraint.pattern)
                continue
            known = _CONSTRAINTS.get(type(constraint))
            if known is None:
                raise UntranslatableConstraint(f"no msgspec translation for constraint {constraint!r}")
            attr, keyword = known
            kwargs[keyword] = getattr(constraint, attr)
        if isinstance(extra, FieldInfo) and _has_unhandled_options(extra):
            raise UntranslatableConstraint(f"no msgspec translation for field options of {extra!r}")
    return msgspec.Meta(**kwargs)


# "None of these characters": a negated class of literals, ranges and \xHH escapes.
_EXCLUDED_CHARACTERS = re.compile(r"\^\[\^(?:[^\]\\\[]|\\x[0-9a-fA-F]{2})+\]\*\$")
# "Exactly n of these characters": a class of plain literals and ranges, a fixed count.
_FIXED_CHARACTERS = re.compile(r"\^\[[0-9A-Za-z-]+\]\{[0-9]+\}\$")


def _is_pattern(constraint: Any) -> bool:
    # pydantic keeps Field(pattern=...) as a private metadata class holding just the pattern.
    return getattr(constraint, "__dict__", None) == {"pattern": getattr(constraint, "pattern", None)}


def python_pattern(pattern: str) -> str:
    """pydantic's pattern as Python's re (msgspec) reads it alike. pydantic (Rust regex) and
    JSON Schema read a final `$` as the end of the string; re also matches it before a final
    newline, so "name\\n" would pass. Only the "^[^...]*$" and "^[a-z0-9]{n}$" forms are
    carried over: other regex features differ between the engines in ways not worth translating."""
    if not (_EXCLUDED_CHARACTERS.fullmatch(pattern) or _FIXED_CHARACTERS.fullmatch(pattern)):
        raise UntranslatableConstraint(f"no msgspec translation for pattern {pattern!r}; use the form ^[^...]*$ or ^[a-z0-9]{{n}}$")
    return pattern[:-1] + r"\Z"


def _has_unhandled_options(info: FieldInfo) -> bool:
    # Constraints live in .metadata (handled above); anything that changes validation
    # elsewhere (aliases, defaults, strictness overrides) would need its own translation.
    return any(getattr(info, name, None) is not None for name in ("alias", "validation_alias"))


class BatchStructDecoder:
    """Decodes a Batch into structs, whole or piecewise: the envelope first (each sample kept as
    raw JSON), then each sample on its own, into the same structs. One call into msgspec holds
    the GIL throughout: for the largest body the limits allow ~0.1 s in which no other request
    of the process moves (issue #12); piecewise, the longest call is one sample's."""

    def __init__(self, holds: frozenset[str] = frozenset()):
        done: dict = {}
        self.batch = derive(Batch, done, structs=True, holds=holds)
        self.whole = msgspec.json.Decoder(self.batch)
        self.sample = msgspec.json.Decoder(derive(SampleIn, done, structs=True, holds=holds))
        self.envelope = msgspec.json.Decoder(_with_raw_samples(self.batch))
        self._names = tuple(f.name for f in msgspec.structs.fields(self.batch) if f.name != "samples")

    def decode(self, body: bytes) -> Any:
        return self.whole.decode(body)

    def decode_piecewise(self, body: bytes) -> Any:
        envelope = self.envelope.decode(body)
        samples = tuple([self.sample.decode(raw) for raw in envelope.samples])
        return self.batch(**{name: getattr(envelope, name) for name in self._names}, samples=samples)


def _with_raw_samples(batch: type) -> type:
    """The Batch struct with `samples` raw JSON (msgspec.Raw), under the same length limit."""
    fields: list[tuple] = []
    for f in msgspec.structs.fields(batch):
        tp = f.type
        if f.name == "samples":
            _, meta = typing.get_args(tp)
            tp = Annotated[tuple[msgspec.Raw, ...], meta]
        if f.required:
            fields.append((f.name, tp))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, tp, f.default))
    return msgspec.defstruct("BatchEnvelope", fields, kw_only=True, gc=False)


BATCH_DECODER = msgspec.json.Decoder(derive(Batch))  # plain dicts, as pydantic builds them
BATCH_STRUCT_DECODER = BatchStructDecoder()  # what ingest uses
# For a body that cannot hold a control character (server/ingest/decode.py): the same, without
# checking every string for one, which took decoding from ~130 to ~300 µs per typical body.
PRINTABLE_BATCH_STRUCT_DECODER = BatchStructDecoder(holds=frozenset({PRINTABLE}))
