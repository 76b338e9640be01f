"""Makes the model the parity suite's vLLM serves: Qwen3.5's architecture at a toy size (random
weights), with the real tokenizer, the official chat template and Qwen3.5's processor configs.

Counts depend on the tokenizer, the template and the processors only, never on the weights, so a
model of a few megabytes counts every prompt, image and video as Qwen3.5-27B does. The shape keeps
what vLLM's CPU kernels need (docs/vllm-parity.md): bf16, linear-attention key/value head dim 128,
a full-attention head dim in {32, 64, ..., 512}, and a one-block vision tower.

    python vllm_model.py --tokenizer tokenizer.json --template chat_template.jinja --out DIR

Run with the vLLM venv's Python (it has torch and transformers). Writes DIR atomically and does
nothing when DIR holds a model made from the same inputs.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys

# Bump when the model below changes: a cached model of another version is made again.
VERSION = "1"

# Qwen3.5's processors (the model repository's preprocessor_config.json and
# video_preprocessor_config.json), the numbers the gateway's vision defaults follow.
# What the two processors share.
PROCESSOR = {
    "processor_class": "Qwen3VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "rescale_factor": 0.00392156862745098,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    **PROCESSOR,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}
VIDEO_PROCESSOR = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    **PROCESSOR,
    "do_sample_frames": True,
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
    "size": {"shortest_edge": 4096, "longest_edge": 25165824},
}


def digest(paths):
    h = hashlib.sha256(VERSION.encode())
    for p in paths:
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def make(tokenizer, template, out):
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    text = {
        "vocab_size": 248320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 1,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
        "eos_token_id": 248046,
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 2304,
    }
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)

    shutil.copyfile(tokenizer, os.path.join(out, "tokenizer.json"))
    with open(template, encoding="utf-8") as f:
        chat_template = f.read()
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                # Loads tokenizer.json as it is: the file the gateway loads.
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 262144,
                "chat_template": chat_template,
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [248046, 248044], "pad_token_id": 248044}, f)
    for name, body in [
        ("preprocessor_config.json", IMAGE_PROCESSOR),
        ("video_preprocessor_config.json", VIDEO_PROCESSOR),
    ]:
        with open(os.path.join(out, name), "w") as f:
            json.dump(body, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    stamp = digest([a.tokenizer, a.template])
    stamp_file = os.path.join(a.out, ".made-from")
    if os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        return
    part = a.out + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(part)
    make(a.tokenizer, a.template, part)
    with open(os.path.join(part, ".made-from"), "w") as f:
        f.write(stamp)
    shutil.rmtree(a.out, ignore_errors=True)
    os.rename(part, a.out)
    print(f"vllm_model: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
