"""A small BPE tokenizer per demo family, trained with `tokenizers` on the
demo corpus and written in the family's own tokenizer.json layout.

The merges are learned by `tokenizers`' BpeTrainer; the files are then laid
out as the family's real tokenizer is (the same normalizer, pre-tokenizer,
decoder and model options as tools/fixtures/make_mm_tokenizers.py uses, which
tandem and transformers both load), with the family's special tokens at the
front and the image tokens at the end:

  gemma3, gemma4  SentencePiece-style BPE with byte fallback; merges learned
                  within words (Metaspace split, digits kept single, as in
                  the real Gemma vocabulary)
  mistral3        byte-level BPE on the tekken split pattern, digits single
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
from make_mm_tokenizers import (  # noqa: E402
    GEMMA4_EXTRA, MISTRAL_CONTROL, SP, TEKKEN_PATTERN, added_entry, added_tokens_decoder, bytes_to_unicode,
    gemma_tokenizer_json, mistral_tokenizer_json, template)

GEMMA3_LEAD = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
GEMMA3_TAIL = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
GEMMA4_LEAD = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [
    GEMMA4_EXTRA[k] for k in ("sot_token", "eot_token", "soc_token", "eoc_token", "think_token", "std_token",
                              "etd_token", "stc_token", "etc_token", "str_token", "etr_token", "escape_token")]
# audio, eoa, boa, video, boi, eoi, image: the last 7 ids, as in the fixtures
GEMMA4_TAIL = ["<|audio|>", "<audio|>", "<|audio>", "<|video|>", "<|image>", "<image|>", "<|image|>"]

MISTRAL_DEMO_SYSTEM = ("You are tandem-ministral-demo, a small demo model that ships with tandem. "
                       "You answer simple questions briefly.")


def learn_merges(texts, n_merges, byte_level):
    tk = Tokenizer(models.BPE())
    if byte_level:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(TEKKEN_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        alphabet = list(bytes_to_unicode().values())
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="never"),
            pre_tokenizers.Digits(individual_digits=True)])
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 200 + n_merges, min_frequency=2,
                                  show_progress=False, initial_alphabet=alphabet, special_tokens=[])
    tk.train_from_iterator(texts, trainer)
    merges = json.loads(tk.to_str())["model"]["merges"]
    merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in merges]
    chars = sorted({c for t in texts for c in t.replace(" ", SP)}) if not byte_level else []
    return merges[:n_merges], chars


class VocabBuilder:
    def __init__(self):
        self.tok, self.id_of = [], {}

    def add(self, t):
        if t in self.id_of:
            return False
        self.id_of[t] = len(self.tok)
        self.tok.append(t)
        return True


def gemma_tokenizer(family, texts, n_merges):
    lead, tail = (GEMMA3_LEAD, GEMMA3_TAIL) if family == "gemma3" else (GEMMA4_LEAD, GEMMA4_TAIL)
    merges, chars = learn_merges(texts, n_merges, byte_level=False)
    v = VocabBuilder()
    for t in lead + ["\n", "\n\n"] + [f"<0x{b:02X}>" for b in range(256)] + [SP]:
        v.add(t)
    for c in chars:
        if c not in ("\n",):
            v.add(c)
    kept = []
    for a, b in merges:
        if a in v.id_of and b in v.id_of and v.add(a + b):
            kept.append([a, b])
    for t in tail:
        v.add(t)
    specials = set(lead) | set(tail)
    added = [added_entry(v.id_of[t], t, True) for t in lead + tail]
    added += [added_entry(v.id_of[t], t, False) for t in ("\n", "\n\n")]
    added.sort(key=lambda a: a["id"])
    assert specials <= set(v.id_of)
    tok = gemma_tokenizer_json(v.tok, kept, added, v.id_of["<bos>"] if family == "gemma3" else None)
    if family == "gemma3":
        extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
        config = {
            "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added_tokens_decoder(added),
            "bos_token": "<bos>", "chat_template": template("gemma3"), "clean_up_tokenization_spaces": False,
            "eos_token": "<end_of_turn>", "extra_special_tokens": extra, "mask_token": "<mask>",
            "model_max_length": 2048, "pad_token": "<pad>", "padding_side": "left",
            "processor_class": "Gemma3Processor", "spaces_between_special_tokens": False,
            "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False,
            **extra,
        }
        ids = {"pad": 0, "eos": 1, "bos": 2, "end_of_turn": v.id_of["<end_of_turn>"],
               "boi": v.id_of["<start_of_image>"], "eoi": v.id_of["<end_of_image>"],
               "image": v.id_of["<image_soft_token>"]}
    else:
        e = GEMMA4_EXTRA
        config = {
            "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": added_tokens_decoder(added),
            "bos_token": "<bos>", "chat_template": template("gemma4_e2b"), "clean_up_tokenization_spaces": False,
            "eos_token": "<eos>", "extra_special_tokens": dict(e), "mask_token": "<mask>",
            "model_max_length": 2048, "pad_token": "<pad>", "padding_side": "left",
            "processor_class": "Gemma4Processor", "spaces_between_special_tokens": False,
            "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>", **e,
        }
        ids = {"pad": 0, "eos": 1, "bos": 2, "end_of_turn": v.id_of["<turn|>"],
               "audio": v.id_of["<|audio|>"], "eoa": v.id_of["<audio|>"], "boa": v.id_of["<|audio>"],
               "video": v.id_of["<|video|>"], "boi": v.id_of["<|image>"], "eoi": v.id_of["<image|>"],
               "image": v.id_of["<|image|>"]}
    return tok, config, len(v.tok), ids


def mistral_template():
    t = template("ministral3")
    start = t.index("set default_system_message = '") + len("set default_system_message = '")
    end = t.index("' %}", start)
    return t[:start] + MISTRAL_DEMO_SYSTEM + t[end:]


def mistral_tokenizer(texts, n_merges):
    merges, _ = learn_merges(texts, n_merges, byte_level=True)
    v = VocabBuilder()
    for t in MISTRAL_CONTROL:
        v.add(t)
    alphabet = bytes_to_unicode()
    for b in range(256):
        v.add(alphabet[b])
    kept = []
    for a, b in merges:
        if a in v.id_of and b in v.id_of and v.add(a + b):
            kept.append([a, b])
    added = [added_entry(i, t, True) for i, t in enumerate(MISTRAL_CONTROL)]
    tok = mistral_tokenizer_json(v.tok, kept, added)
    config = {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added_tokens_decoder(added),
        "bos_token": "<s>", "chat_template": mistral_template(), "clean_up_tokenization_spaces": False,
        "eos_token": "</s>", "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 4096,
        "pad_token": "<pad>", "processor_class": "PixtralProcessor", "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }
    ids = {"pad": 11, "eos": 2, "bos": 1, "end_of_turn": 2, "image": 10, "image_break": 12, "image_end": 13}
    return tok, config, len(v.tok), ids


def build(family, texts, n_merges, out_dir):
    """Writes tokenizer.json and tokenizer_config.json; returns (vocab size, special ids)."""
    if family == "mistral3":
        tok, config, n, ids = mistral_tokenizer(texts, n_merges)
    else:
        tok, config, n, ids = gemma_tokenizer(family, texts, n_merges)
    os.makedirs(out_dir, exist_ok=True)
    for name, obj in (("tokenizer.json", tok), ("tokenizer_config.json", config)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(json.dumps(obj, ensure_ascii=False, indent=1) + "\n")
    return n, ids
