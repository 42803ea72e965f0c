"""A threshold per language: one config value type for every rule of `langid`, `lines` and `heuristics`.

A rule's threshold is written either as a scalar, applied to every language as before, or as a
mapping from language codes (the document's `lang`, from langid) to values, with `default` for
the languages not named:

    line_punct_thr: 0.12
    line_punct_thr: {default: 0.12, es: 0.182, pt: 0.077}
    min_num_sentences: {default: 5, es: off, pt: off}      # the rule is switched off for es, pt

`off` (or null; YAML reads a bare off as false, which means the same) switches the rule off for that language; what "off" means for a rule (a bound
that can never be crossed) is the rule's business (`resolve(value, lang, off=...)`). FineWeb-2
(Penedo et al., 2025) derives each language's values from data; `quipu calibrate` writes them in
this form.
"""
from __future__ import annotations

from typing import Annotated, Any, TypeVar, Union

from annotated_types import Interval
from pydantic import BeforeValidator, ValidationError, WrapValidator

T = TypeVar("T")
OFF = "off"


def _is_off(value: Any, kind: Any) -> bool:
    # YAML 1.1 (PyYAML) reads a bare `off` as false: for a rule that is not a switch it means off
    return value is None or (isinstance(value, str) and value == OFF) or (value is False and kind is not bool)


def _check_mapping(value: Any, kind: Any) -> Any:
    """A mapping must name `default`; keys must be language codes; `off` becomes None."""
    if not isinstance(value, dict):
        return None if _is_off(value, kind) else value
    if "default" not in value:
        raise ValueError("a per-language value needs a `default` key, e.g. {default: 0.12, es: 0.18}")
    for key in value:
        if key != "default":
            check_language_code(key)
    return {k: None if _is_off(v, kind) else v for k, v in value.items()}


# the labels of fastText's lid.176 (what stage langid writes to `lang`): a code outside them names
# no document, so a typo ('ES', 'spa', 'xx') would silently leave the default in force
LID_CODES = frozenset("""
af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co cs cv cy
da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr hsb ht hu hy ia
id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt lv mai mg mhr min mk ml
mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue
sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo
wa war wuu xal xmf yi yo yue zh""".split())


def check_language_code(code: Any) -> str:
    """`code` when it is a language langid can give a document; ValueError naming the known codes."""
    if not isinstance(code, str) or code not in LID_CODES:
        hint = f" (did you mean '{code.lower()}'?)" if isinstance(code, str) and code.lower() in LID_CODES else ""
        raise ValueError(f"{str(code)[:40]!r} is not a language code langid gives{hint}: one of es, pt, en, ... "
                         f"(the {len(LID_CODES)} lid.176 codes, lower case, e.g. 'es' not 'ES' or 'spa')")
    return code


KIND_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a path"}


def PerLanguage(kind: Any, **bounds: float) -> Any:
    """The config type of a per-language threshold of scalar type `kind` (e.g. `PerLanguage(float)`,
    `PerLanguage(float, ge=0, le=1)`): a `kind` within `bounds`, `off`/null, or
    `{default: kind, <lang>: kind | off, ...}`, each value within `bounds`. A bad value gets one
    message saying what was expected (not one per branch of the union)."""
    what = KIND_NAMES.get(kind, "a list like [[2, 0.2], [3, 0.18]]")
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    if bounds:
        what += " " + " and ".join(f"{symbols[op]} {bound}" for op, bound in bounds.items())
        kind = Annotated[kind, Interval(**bounds)]

    def one_message(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"expected {what}, `off`, or one per language like {{default: <value>, es: <value>}}") from None

    return Annotated[Union[kind, None, dict[str, Union[kind, None]]], WrapValidator(one_message),
                     BeforeValidator(lambda v: _check_mapping(v, kind))]


def resolve(value: Any, lang: str | None, off: Any = None) -> Any:
    """The value that applies to a document in `lang`; `off` where the rule is switched off."""
    if isinstance(value, dict):
        value = value.get(lang, value["default"]) if lang is not None else value["default"]
    return off if value is None else value


def languages_named(value: Any) -> set[str]:
    """The languages a per-language value names explicitly (empty for a scalar)."""
    return {k for k in value if k != "default"} if isinstance(value, dict) else set()
