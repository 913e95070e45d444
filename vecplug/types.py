"""Shared plain data types. Imports nothing of ours, so every layer can use it."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

#: The deepest a document's payload may nest (``{"a": 1}``: 1, ``{"a": [1]}``: 2). Qdrant's
#: engine refuses a point payload nested deeper than ~125 levels ("recursion limit exceeded"),
#: and only while applying a commit, after its commit point: such a payload made an embedded
#: index unopenable. 64 is far below that (a point wraps the payload in two more levels) and
#: far above what real records need; every store refuses deeper payloads, so all hold the
#: same documents.
MAX_PAYLOAD_DEPTH = 64
#: Integers a payload may hold: signed 64-bit, what Qdrant keeps exactly (beyond it the engine
#: turns them into floats at commit: 12345678901234567890123 read back as 1.2345678901234568e+22;
#: gRPC payloads carry int64 only).
PAYLOAD_INT_RANGE = (-2**63, 2**63 - 1)

#: hnswlib graph defaults, shared by the store and the configuration. ef_search was chosen by
#: benchmarks/ann_scale.py (README "Speed"): at 100k clustered 384-d vectors, ef 128 finds 98%
#: of the true top 10 (ef 64: 95%) for ~0.4 ms more, next to 15-40 ms of query encoding
HNSW_DEFAULTS: dict[str, int] = {"M": 16, "ef_construction": 200, "ef_search": 128}


#: an ISO 639 code (1, 2 or 3: two or three letters), what the language detector writes
_LANG_CODE = re.compile(r"[a-z]{2,3}")
#: three-letter codes (ISO 639-2/B and /T, a few 639-3 individual languages, and the varieties
#: the detector reports as their macrolanguage) of the languages that the detector (fastText
#: lid.176) names by two letters: "eng" would match no detected "en". From pycountry's ISO 639
#: tables, restricted to lid.176's labels.
_AS_DETECTED: dict[str, str] = dict(pair.split(":") for pair in (
    "afr:af alb:sq amh:am ara:ar arb:ar arg:an arm:hy arz:ar asm:as ava:av aze:az azj:az "
    "bak:ba baq:eu bel:be ben:bn bod:bo bos:bs bre:br bul:bg bur:my cat:ca ces:cs che:ce "
    "chi:zh chv:cv cmn:zh cor:kw cos:co cym:cy cze:cs dan:da deu:de div:dv dut:nl ekk:et "
    "ell:el eng:en epo:eo est:et eus:eu fas:fa fil:tl fin:fi fra:fr fre:fr fry:fy geo:ka "
    "ger:de gla:gd gle:ga glg:gl glv:gv gre:el grn:gn guj:gu hat:ht hbs:sh heb:he hin:hi "
    "hrv:hr hun:hu hye:hy ice:is ido:io ile:ie ina:ia ind:id isl:is ita:it jav:jv jpn:ja "
    "kan:kn kat:ka kaz:kk khk:mn khm:km kir:ky kom:kv kor:ko kur:ku lao:lo lat:la lav:lv "
    "lim:li lit:lt ltz:lb lvs:lv mac:mk mal:ml mar:mr may:ms mkd:mk mlg:mg mlt:mt mon:mn "
    "msa:ms mya:my nep:ne nld:nl nno:nn nob:no nor:no oci:oc ori:or oss:os pan:pa per:fa "
    "pes:fa plt:mg pol:pl por:pt pus:ps que:qu roh:rm ron:ro rum:ro rus:ru san:sa sin:si "
    "slk:sk slo:sk slv:sl snd:sd som:so spa:es sqi:sq srd:sc srp:sr sun:su swa:sw swe:sv "
    "swh:sw tam:ta tat:tt tel:te tgk:tg tgl:tl tha:th tib:bo tuk:tk tur:tr uig:ug ukr:uk "
    "urd:ur uzb:uz uzn:uz vie:vi vol:vo wel:cy wln:wa wuu:zh yid:yi yor:yo yue:zh zho:zh "
    "zsm:ms "
).split())
# two-letter codes the detector writes otherwise: Norwegian Bokmål (nb-NO), and the ISO 639-1
# codes withdrawn in 1989 that old systems still send
_AS_DETECTED.update({"nb": "no", "iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro"})


def lang_code(code: str | None) -> str | None:
    """A language code as the language detector writes it: ``" pt-BR"`` -> ``"pt"``,
    ``"ru_RU"`` -> ``"ru"``, ``"deu"`` -> ``"de"``, blank -> None. Documents are tagged and filtered by these codes,
    so a region or script subtag, a capital or a space would match nothing.

    Raises ValueError for what is not an ISO 639 code (``"English"``): stored as given, it
    would match no detected language, and a mono search would find nothing."""
    if code is None:
        return None
    given = str(code).strip()
    primary = given.replace("_", "-").split("-")[0].lower()
    if (primary or given) and not _LANG_CODE.fullmatch(primary):  # ("-en", "-": no language before the tag)
        raise ValueError(f"{given!r} is not a language code "
                         "(ISO 639, two or three letters: en, de, pt-BR, yue)")
    return _AS_DETECTED.get(primary, primary) or None


@dataclass(frozen=True)
class Document:
    """One unit of retrieval: a passage of a file or a record of a JSONL/CSV file.

    ``id`` is stable across runs (source path + position), ``text`` is what gets embedded
    (all fields appended), ``payload`` keeps the original fields for display and filtering.
    """

    id: str
    text: str
    source: str
    position: int = 0
    lang: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """One search result."""

    id: str
    score: float
    text: str
    lang: str | None
    source: str
    payload: dict[str, Any]
    rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "id": self.id,
            "score": self.score,
            "lang": self.lang,
            "source": self.source,
            "text": self.text,
            "payload": self.payload,
        }


@dataclass(frozen=True)
class Problem:
    """A piece of input that was skipped, with where it was and why; ``kept``: the input was
    used all the same, without the value named (a language that is no code, detected instead)."""

    path: str
    reason: str
    line: int | None = None
    kept: bool = False

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.reason}"


def unstorable(value: Any) -> str | None:
    """Why ``value`` (a document's payload, or anything in it) cannot be stored as it is by
    every store, or None: nesting deeper than :data:`MAX_PAYLOAD_DEPTH`, a NaN or infinite
    float (JSON cannot carry it; Qdrant's engine refuses it at commit), an integer outside
    :data:`PAYLOAD_INT_RANGE`. The one check that stores' ``upsert`` and the indexer both
    apply, so that a document is refused before anything is staged. Iterative: a hostile
    payload may nest far deeper than Python's recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    lo, hi = PAYLOAD_INT_RANGE
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth >= MAX_PAYLOAD_DEPTH:
                return f"its payload nests deeper than {MAX_PAYLOAD_DEPTH} levels"
            inner = item.values() if isinstance(item, dict) else item
            stack.extend((v, depth + 1) for v in inner)
            if isinstance(item, dict) and not all(isinstance(k, str) for k in item):
                return "a payload key is not a string"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"a value is {item}, which JSON cannot carry"
        elif isinstance(item, int) and not isinstance(item, bool) and not lo <= item <= hi:
            return "an integer is outside signed 64 bits, which Qdrant cannot keep exactly"
        elif not isinstance(item, (str, int, float, type(None))):
            # a date, a numpy number (pandas), a set: JSON cannot carry it as it is
            return (f"a value is a {type(item).__name__}, which JSON cannot carry (give strings, "
                    "numbers, booleans, lists and mappings)")
    return None
