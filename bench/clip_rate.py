"""How often do the LSTM's cell and projection clips fire on real text? (the question before any nn.LSTM/cuDNN path)

bilm-tf's cells clip the memory cell to ±cell_clip and the projected output to ±proj_clip at every step; PyTorch's
``nn.LSTM(proj_size=…)`` (and cuDNN) cannot. Swapping them is exact only where no clip ever changes a value. This
script runs trained biLMs over real sentences (the first ``--sentences`` of UD English-EWT dev, each with ``<S> …
</S>``, from a zero state, as elmokit embeds) with the cell equations written out step by step, and counts, per layer
and direction, the fraction of (real position, unit) values that a clip changed and the fraction of positions with at
least one clipped unit; then it reruns without clipping and reports the max abs change of the top layer.

Run: ``python bench/clip_rate.py MODEL [MODEL …] [--sentences 500]`` where MODEL is a native folder (``config.json`` +
``model.safetensors``), an original-format folder, or ``fixture:allennlp-elmo`` / ``fixture:bilm-tf`` (the reference
fixtures in ../shared). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from inference import EWT_DEV, read_conllu_forms  # noqa: E402


def load(spec: str):
    from elmokit.weights.native import load_pretrained_bilm
    from elmokit.weights.original import load_original

    if spec.startswith("fixture:"):
        name = spec.split(":", 1)[1]
        d = ROOT.parent / "shared" / "fixtures" / name / ("model" if name == "bilm-tf" else "")
        return load_original(d / "options.json", d / "lm_weights.hdf5").eval()
    return load_pretrained_bilm(spec).eval()


def run_layers(bilm, tokens: torch.Tensor, lengths: torch.Tensor, clip: bool) -> tuple[torch.Tensor, list[dict]]:
    """The BiLSTM's cell equations over (B, T, P) token vectors (sentence order), padded loop; returns the top layer
    (2, B, T, P) and per layer/direction clip counts."""
    from elmokit.modules.bilm import reverse_padded

    lstm = bilm.bilstm
    cfg = lstm.config
    b, t, _ = tokens.shape
    x = torch.stack([tokens, reverse_padded(tokens, lengths)])  # (2, B, T, P), each direction in its reading order
    running = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).T  # (T, B)
    stats = []
    for k in range(lstm.n_layers):
        c = torch.zeros(2, b, lstm.hidden_dim)
        h = torch.zeros(2, b, lstm.projection_dim)
        bias = lstm.bias[k] + lstm._forget_bias(lstm.hidden_dim, lstm.bias[k])
        out = torch.zeros(2, b, t, lstm.projection_dim)
        counts = torch.zeros(2, 4)  # cell values clipped, positions with a cell clip, proj values, proj positions
        for s in range(t):
            live = running[s]
            z = torch.baddbmm(bias.unsqueeze(1), x[:, :, s], lstm.weight_ih[k]) + torch.bmm(h, lstm.weight_hh[k])
            i, j, f, o = z.chunk(4, dim=-1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
            over_c = (c_new.abs() > cfg.cell_clip) & live.view(1, b, 1) if cfg.cell_clip else None
            if clip and cfg.cell_clip:
                c_new = c_new.clamp(-cfg.cell_clip, cfg.cell_clip)
            h_new = torch.bmm(torch.sigmoid(o) * torch.tanh(c_new), lstm.weight_proj[k])
            over_h = (h_new.abs() > cfg.proj_clip) & live.view(1, b, 1) if cfg.proj_clip else None
            if clip and cfg.proj_clip:
                h_new = h_new.clamp(-cfg.proj_clip, cfg.proj_clip)
            keep = live.view(1, b, 1)
            c = torch.where(keep, c_new, c)
            h = torch.where(keep, h_new, h)
            out[:, :, s] = torch.where(keep, h_new, torch.zeros_like(h_new))
            if over_c is not None:
                counts[:, 0] += over_c.sum((1, 2))
                counts[:, 1] += over_c.any(-1).sum(1)
            if over_h is not None:
                counts[:, 2] += over_h.sum((1, 2))
                counts[:, 3] += over_h.any(-1).sum(1)
        if cfg.use_skip_connections and k > 0:
            out = out + x
        n_pos = float(lengths.sum())
        for d, name in enumerate(("forward", "backward")):
            stats.append(
                {
                    "layer": k,
                    "direction": name,
                    "cell_values_clipped": float(counts[d, 0]) / (n_pos * lstm.hidden_dim),
                    "positions_with_cell_clip": float(counts[d, 1]) / n_pos,
                    "proj_values_clipped": float(counts[d, 2]) / (n_pos * lstm.projection_dim),
                    "positions_with_proj_clip": float(counts[d, 3]) / n_pos,
                }
            )
        x = out
    return x, stats


def measure(spec: str, sentences: list[list[str]]) -> dict:
    from elmokit import batch_to_ids
    from elmokit.modules.bilm import add_sentence_boundaries

    bilm = load(spec)
    cfg = bilm.config.lstm
    ids = batch_to_ids(sentences, bilm.config.char_cnn.max_characters_per_token, char_vocab=bilm.char_vocab)
    with torch.no_grad():
        bounded, mask = add_sentence_boundaries(ids, bilm._bos, bilm._eos)
        tokens = bilm.token_encoder(bounded)
        lengths = mask.sum(1)
        top_clip, stats = run_layers(bilm, tokens, lengths, clip=True)
        top_free, _ = run_layers(bilm, tokens, lengths, clip=False)
        reference = bilm(ids, keep_sentence_boundaries=True).layers[:, -1]  # (B, T, 2P), sentence order
    from elmokit.modules.bilm import reverse_padded

    mine = torch.cat([top_clip[0], reverse_padded(top_clip[1], lengths)], dim=-1) * mask.unsqueeze(-1)
    free = torch.cat([top_free[0], reverse_padded(top_free[1], lengths)], dim=-1) * mask.unsqueeze(-1)
    return {
        "model": spec,
        "cell_clip": cfg.cell_clip,
        "proj_clip": cfg.proj_clip,
        "sentences": len(sentences),
        "positions": int(lengths.sum()),
        "layers": stats,
        "check_max_abs_diff_vs_bilm": float((mine - reference).abs().max()),
        "top_layer_max_abs_change_without_clipping": float((free - mine).abs().max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="native/original folders or fixture:allennlp-elmo, fixture:bilm-tf")
    ap.add_argument("--sentences", type=int, default=500, help="first N sentences of UD English-EWT dev")
    args = ap.parse_args()
    torch.set_num_threads(2)
    sentences = read_conllu_forms(EWT_DEV, args.sentences)
    results = [measure(m, sentences) for m in args.models]
    for r in results:
        print(
            f"\n{r['model']}  (cell_clip {r['cell_clip']}, proj_clip {r['proj_clip']}; {r['sentences']} sentences, "
            f"{r['positions']} positions with boundaries; check vs BiLM {r['check_max_abs_diff_vs_bilm']:.1e})"
        )
        print(
            "| layer | direction | cell values clipped | positions with a cell clip | proj values clipped | "
            "positions with a proj clip |"
        )
        print("|---|---|---|---|---|---|")
        for s in r["layers"]:
            print(
                f"| {s['layer']} | {s['direction']} | {s['cell_values_clipped']:.2e} | "
                f"{s['positions_with_cell_clip']:.2%} | {s['proj_values_clipped']:.2e} | "
                f"{s['positions_with_proj_clip']:.2%} |"
            )
        print(
            f"top layer, max abs change if the clips were dropped: {r['top_layer_max_abs_change_without_clipping']:.3g}"
        )
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
