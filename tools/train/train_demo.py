#!/usr/bin/env python3
"""Trains one of tandem's demo models on the GPU machine (torch + transformers).

    train_demo.py FAMILY OUT_DIR [--steps N] [--quick] [--seed-set coherence/seed.json]

FAMILY is gemma3 (Gemma 3 with a SigLIP tower), gemma4 (Gemma 4 E2B-style:
per-layer embeddings, KV sharing, double-wide MLP, the Gemma 4 vision tower)
or mistral3 (Ministral 3 text with a Pixtral tower). OUT_DIR receives:

  model/       the checkpoint tandem loads: config.json, model.safetensors
               (bf16), generation_config.json, tokenizer.json,
               tokenizer_config.json (the family's real chat template),
               preprocessor_config.json
  golden.json  the demo's golden cases (OpenAI messages, image file names,
               accepted answers) with transformers' greedy answers
  golden/      the golden images (PNG)
  scores.json  greedy accuracy per category, measured by transformers on the
               saved bf16 checkpoint: training questions, golden cases and
               held-out images
  log.txt      training loss

The model is trained from scratch on demo_data.py's instruction set (loss on
the answer and the end-of-turn token only) until it answers its training
questions greedily. --quick runs a few steps (a smoke test of the script).
"""
import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
import demo_data  # noqa: E402
import demo_tokenizer  # noqa: E402

END_MARKER = {"gemma3": "<end_of_turn>", "gemma4": "<turn|>", "mistral3": "</s>"}
N_MERGES = 1200


def corpus_texts(examples):
    texts = []
    for e in examples:
        for m in e["messages"]:
            c = m["content"]
            texts.append(c if isinstance(c, str) else " ".join(p.get("text", "") for p in c))
        texts.append(e["answer"])
    texts += demo_data.SYSTEM_PROMPTS + [demo_tokenizer.MISTRAL_DEMO_SYSTEM]
    return texts


def model_and_processor(family, vocab, ids, tok):
    if family == "gemma3":
        from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor,
                                  Gemma3Processor)
        text = dict(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64,
                    max_position_embeddings=2048, sliding_window=512,
                    layer_types=["sliding_attention"] * 5 + ["full_attention"], rms_norm_eps=1e-6,
                    pad_token_id=ids["pad"], eos_token_id=ids["eos"], bos_token_id=ids["bos"],
                    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
        vision = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
                      image_size=64, patch_size=8)
        cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=16,
                           boi_token_index=ids["boi"], eoi_token_index=ids["eoi"], image_token_index=ids["image"])
        model = Gemma3ForConditionalGeneration(cfg)
        ip = Gemma3ImageProcessor(size={"height": 64, "width": 64}, do_pan_and_scan=False)
        proc = Gemma3Processor(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template,
                               image_seq_length=16)
        keys = ("pixel_values", "token_type_ids")
        return model, proc, ip, keys
    if family == "gemma4":
        from transformers import (Gemma4AudioFeatureExtractor, Gemma4Config, Gemma4ForConditionalGeneration,
                                  Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor)
        text = dict(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=64, global_head_dim=128,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                 "sliding_attention", "sliding_attention", "full_attention"],
                    sliding_window=512, max_position_embeddings=2048, rms_norm_eps=1e-6,
                    hidden_size_per_layer_input=32, vocab_size_per_layer_input=vocab, num_kv_shared_layers=2,
                    use_double_wide_mlp=True, final_logit_softcapping=30.0,
                    pad_token_id=ids["pad"], eos_token_id=ids["eos"], bos_token_id=ids["bos"])
        vision = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=64, patch_size=8, pooling_kernel_size=3,
                      position_embedding_size=64)
        cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=None,
                           boi_token_id=ids["boi"], eoi_token_id=ids["eoi"], image_token_id=ids["image"],
                           video_token_id=ids["video"], boa_token_id=ids["boa"], eoa_token_index=ids["eoa"],
                           audio_token_id=ids["audio"])
        model = Gemma4ForConditionalGeneration(cfg)
        ip = Gemma4ImageProcessor(patch_size=8, pooling_kernel_size=3, max_soft_tokens=70)
        proc = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=ip, tokenizer=tok,
                               video_processor=Gemma4VideoProcessor(), chat_template=tok.chat_template,
                               image_seq_length=70)
        keys = ("pixel_values", "image_position_ids", "mm_token_type_ids")
        return model, proc, ip, keys
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessor, PixtralProcessor
    text = dict(model_type="ministral3", vocab_size=vocab, hidden_size=256, intermediate_size=768,
                num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=True,
                bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"],
                rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 1024, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})
    vision = dict(model_type="pixtral", hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=2, head_dim=64, image_size=64, patch_size=8)
    cfg = Mistral3Config(text_config=text, vision_config=vision, image_token_index=ids["image"],
                         spatial_merge_size=2, tie_word_embeddings=True)
    model = Mistral3ForConditionalGeneration(cfg)
    ip = PixtralImageProcessor(size={"longest_edge": 64}, patch_size={"height": 16, "width": 16})
    proc = PixtralProcessor(image_processor=ip, tokenizer=tok, patch_size=8, spatial_merge_size=2,
                            chat_template=tok.chat_template, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                            image_end_token="[IMG_END]")
    return model, proc, ip, ("pixel_values", "image_sizes")


class Encoder:
    """Turns examples into token ids (prompt through the real template and
    processor, then the answer and the end-of-turn marker)."""

    def __init__(self, family, tok, proc, keys):
        self.family, self.tok, self.proc, self.keys = family, tok, proc, keys

    def prompt_text(self, messages, rng=None):
        kwargs = {}
        if rng is not None and rng.random() < 0.5:
            kwargs["enable_thinking"] = False
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def prompt(self, example, rng=None):
        text = self.prompt_text(example["messages"], rng)
        kw = {"text": text, "return_tensors": "pt", "add_special_tokens": False}
        if example["image"] is not None:
            kw["images"] = [example["image"]]
        enc = self.proc(**kw)
        extra = {k: enc[k] for k in self.keys if k in enc}
        return enc["input_ids"][0].tolist(), extra

    def example(self, example, rng=None):
        ids, extra = self.prompt(example, rng)
        answer = self.tok(example["answer"] + END_MARKER[self.family], add_special_tokens=False)["input_ids"]
        return {"ids": ids + answer, "n_prompt": len(ids), "extra": extra}


def collate(items, pad_id, device):
    n = max(len(it["ids"]) for it in items)
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    labels = torch.full((len(items), n), -100, dtype=torch.long)
    for i, it in enumerate(items):
        L = len(it["ids"])
        ids[i, :L] = torch.tensor(it["ids"])
        mask[i, :L] = 1
        labels[i, it["n_prompt"]:L] = ids[i, it["n_prompt"]:L]
    batch = {"input_ids": ids, "attention_mask": mask}
    extras = [it["extra"] for it in items]
    if extras[0]:
        for k in extras[0]:
            vals = [e[k] for e in extras]
            if k in ("token_type_ids", "mm_token_type_ids"):
                t = torch.zeros((len(items), n), dtype=torch.long)
                for i, v in enumerate(vals):
                    t[i, :v.shape[1]] = v[0]
                batch[k] = t
            elif k == "pixel_values" and vals[0].dim() == 4 and "image_sizes" in extras[0]:
                H = max(v.shape[2] for v in vals)
                W = max(v.shape[3] for v in vals)
                t = torch.zeros((len(items), 3, H, W), dtype=vals[0].dtype)
                for i, v in enumerate(vals):
                    t[i, :, :v.shape[2], :v.shape[3]] = v[0]
                batch[k] = t
            else:
                batch[k] = torch.cat(vals)
    return {k: v.to(device) for k, v in batch.items()}, labels.to(device)


def normalize(s):
    s = s.strip().strip("\"'`*_").strip()
    while s and s[-1] in ".!?,;:。！？，":
        s = s[:-1]
    return s.strip().casefold()


@torch.no_grad()
def greedy(model, enc, example, device, eos_ids, max_new=24):
    ids, extra = enc.prompt(example)
    inputs = {"input_ids": torch.tensor([ids], device=device),
              "attention_mask": torch.ones((1, len(ids)), dtype=torch.long, device=device)}
    for k, v in extra.items():
        inputs[k] = v.to(device)
        if torch.is_floating_point(inputs[k]):
            inputs[k] = inputs[k].float()
    out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False, eos_token_id=eos_ids,
                         pad_token_id=enc.tok.pad_token_id)
    new = out[0, len(ids):].tolist()
    text = enc.tok.decode([t for t in new if t not in eos_ids], skip_special_tokens=True)
    return text, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("family", choices=["gemma3", "gemma4", "mistral3"])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget")
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--images", type=int, default=8000, help="training images in the pool")
    ap.add_argument("--image-batch", type=int, default=0, help="batch size of image steps (default: --batch)")
    ap.add_argument("--image-fraction", type=float, default=0.5, help="share of steps that are image steps")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed-set", default=os.path.join(os.path.dirname(__file__), "..", "..", "coherence",
                                                       "seed.json"))
    a = ap.parse_args()
    if a.quick:
        a.steps, a.images = 20, 64
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    prng = random.Random(0)
    device = "cuda"
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "log.txt"), "w")

    def say(*xs):
        line = " ".join(str(x) for x in xs)
        print(f"[{a.family} {time.time() - t0:6.1f}s] {line}", flush=True)
        log.write(line + "\n")
        log.flush()

    seed_cases = []
    if os.path.exists(a.seed_set):
        with open(a.seed_set) as f:
            for c in json.load(f).get("cases", []):
                if all(isinstance(m.get("content"), str) for m in c.get("messages", [])) and c.get("accept"):
                    seed_cases.append({"messages": c["messages"], "accept": c["accept"]})
    say("seed cases", len(seed_cases))
    texts = demo_data.text_examples(seed_cases)
    golden_text = demo_data.golden_text_cases()
    golden_img = demo_data.golden_image_cases()
    mdir = os.path.join(a.out, "model")
    vocab, ids = demo_tokenizer.build(a.family, corpus_texts(texts), N_MERGES, mdir)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(mdir)
    say("vocab", vocab, "len(tok)", len(tok), "ids", ids)
    model, proc, ip, keys = model_and_processor(a.family, vocab, ids, tok)
    eos_ids = sorted({ids["eos"], ids["end_of_turn"]})
    enc = Encoder(a.family, tok, proc, keys)
    model.to(device)
    say("parameters", sum(p.numel() for p in model.parameters()))

    # Encoded pools. Text: every example, plus copies with a system prompt.
    text_pool = [enc.example(e, prng) for e in texts]
    text_pool += [enc.example(demo_data.with_system(e, rng), prng) for e in prng.sample(texts, len(texts) // 5)]
    single = [e for e in texts if len(e["messages"]) == 1]
    text_pool += [enc.example(demo_data.with_history(e, single, rng), prng)
                  for e in prng.sample(single, len(single) // 3)]
    for _, messages, accept in golden_text:
        for _ in range(4):
            text_pool.append(enc.example({"messages": messages, "answer": accept[0], "image": None}, prng))
    say("text pool", len(text_pool), "max len", max(len(x["ids"]) for x in text_pool))
    image_examples = [demo_data.image_example(rng) for _ in range(a.images)]
    image_pool = [enc.example(e, prng) for e in image_examples]
    for *_, ex in golden_img:
        image_pool += [enc.example(ex, prng) for _ in range(4)]
    say("image pool", len(image_pool), "max len", max(len(x["ids"]) for x in image_pool))

    # The schedule runs on whichever ends first, the step count or the time
    # budget: warmup, then cosine decay to a tenth of the peak rate.
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = 100
    t_train = time.time()
    model.train()
    step = skipped = 0
    while True:
        progress = max(step / a.steps, (time.time() - t_train) / (60 * a.minutes))
        if progress >= 1:
            break
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        is_image = int((step + 1) * a.image_fraction) > int(step * a.image_fraction)
        pool, bs = (image_pool, a.image_batch or a.batch) if is_image else (text_pool, a.batch)
        items = prng.sample(pool, min(bs, len(pool)))
        batch, labels = collate(items, ids["pad"], device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(**batch).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(loss) and torch.isfinite(norm):
            opt.step()
        else:  # a bf16 overflow: skip the batch rather than poison the weights
            skipped += 1
        if step % 200 == 0 or step in (1, 10, 50):
            say(f"step {step} {'image' if is_image else 'text'} loss {loss.item():.4f} lr {lr:.2e} "
                f"progress {progress:.3f}")
        step += 1
    say(f"trained {step} steps in {time.time() - t_train:.0f} s, {skipped} skipped as non-finite")
    steps_done = step

    # Save in bf16 with the family's files, then evaluate what was saved.
    model.eval()
    model.to(torch.bfloat16).save_pretrained(mdir, safe_serialization=True)
    ip.save_pretrained(mdir)
    with open(os.path.join(mdir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ids["bos"], "eos_token_id": eos_ids, "pad_token_id": ids["pad"],
                   "do_sample": False}, f, indent=1)
    cls = type(model)
    del model
    model = cls.from_pretrained(mdir, dtype=torch.float32).to(device).eval()

    def accuracy(examples, limit):
        hits, wrong = 0, []
        for e in examples[:limit]:
            got, _ = greedy(model, enc, e, device, eos_ids)
            if normalize(got) == normalize(e["answer"]):
                hits += 1
            elif len(wrong) < 8:
                wrong.append({"q": e["messages"][-1]["content"] if isinstance(e["messages"][-1]["content"], str)
                              else e["messages"][-1]["content"][-1]["text"], "want": e["answer"], "got": got})
        return {"n": min(limit, len(examples)), "correct": hits, "wrong_examples": wrong}

    n_eval = 8 if a.quick else 50
    scores = {"family": a.family, "transformers_version": transformers.__version__, "steps": steps_done, "batch": a.batch, "image_batch": a.image_batch or a.batch,
              "image_fraction": a.image_fraction, "minutes": a.minutes,
              "parameters": sum(p.numel() for p in model.parameters()), "vocab": vocab, "categories": {}}
    by_cat = {}
    for e in texts:
        by_cat.setdefault(e["category"], []).append(e)
    for cat, exs in sorted(by_cat.items()):
        prng.shuffle(exs)
        scores["categories"][cat] = accuracy(exs, n_eval)
        say(cat, scores["categories"][cat]["correct"], "/", scores["categories"][cat]["n"])
    train_imgs = image_examples[:n_eval]
    scores["categories"]["image_train"] = accuracy(train_imgs, n_eval)
    held = [demo_data.image_example(np.random.default_rng(50000 + i)) for i in range(n_eval)]
    scores["categories"]["image_heldout"] = accuracy(held, n_eval)
    for k in ("image_train", "image_heldout"):
        say(k, scores["categories"][k]["correct"], "/", scores["categories"][k]["n"])

    gdir = os.path.join(a.out, "golden")
    os.makedirs(gdir, exist_ok=True)
    golden = {"family": a.family, "cases": []}
    passed = 0
    for cid, messages, accept in golden_text:
        got, pids = greedy(model, enc, {"messages": messages, "image": None, "answer": accept[0]}, device, eos_ids)
        ok = normalize(got) in [normalize(x) for x in accept]
        passed += ok
        golden["cases"].append({"id": cid, "messages": messages, "accept": accept, "transformers_answer": got,
                                "pass": ok, "prompt_ids": pids})
    for cid, img, q, accept, ex in golden_img:
        img.save(os.path.join(gdir, cid + ".png"))
        got, pids = greedy(model, enc, ex, device, eos_ids)
        ok = normalize(got) in [normalize(x) for x in accept]
        passed += ok
        golden["cases"].append({"id": cid, "image": cid + ".png", "question": q, "accept": accept,
                                "transformers_answer": got, "pass": ok, "prompt_ids": pids})
    scores["golden"] = {"n": len(golden["cases"]), "correct": passed}
    say("golden", passed, "/", len(golden["cases"]))
    for c in golden["cases"]:
        if not c["pass"]:
            say("  golden miss", c["id"], repr(c["transformers_answer"]))
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
    with open(os.path.join(a.out, "scores.json"), "w") as f:
        json.dump(scores, f, ensure_ascii=False, indent=1)
    say("done; checkpoint bytes", sum(os.path.getsize(os.path.join(mdir, x)) for x in os.listdir(mdir)))


if __name__ == "__main__":
    main()
