"""The dense arch's step (bottom MLP, interaction, top MLP: forward, backward with the pooled
embeddings' gradient, optimizer step) at each embedding dim and three batch sizes."""

from __future__ import annotations

import torch

from recscale.measure.config import CalibrationConfig, dense_inputs
from recscale.measure.timing import median_time
from recscale.model import DenseArch, ModelConfig, dense_model, dense_spec


def measure_dense(model_cfg: ModelConfig, num_tables: int, cfg: CalibrationConfig, progress):
    """The dense arch's forward + backward (the pooled embeddings' gradient included) + optimizer
    step at each of ``cfg.dims`` (the interaction's cost grows with the dim far from the MLPs'
    FLOP rate) and three batch sizes."""
    loss_fn = torch.nn.BCEWithLogitsLoss()
    pts = []
    # three batch sizes at least (a fixed and a per-FLOP cost are fitted), 5 steps each at least
    sizes = sorted({*cfg.batch_sizes, (min(cfg.batch_sizes) + max(cfg.batch_sizes)) // 2})
    for d in cfg.dims:
        mcfg = dense_model(model_cfg, d)
        torch.manual_seed(0)
        num_dense = dense_inputs(cfg)
        arch = DenseArch(num_dense, num_tables, mcfg)
        opt = torch.optim.Adam(arch.parameters(), lr=1e-3, foreach=True)
        spec = dense_spec(mcfg, num_tables, num_dense)
        for B in sizes:
            x = torch.randn(B, num_dense)
            # the pooled embeddings take a gradient, as in training (the interaction's backward
            # computes it for the embeddings' own backward)
            emb = torch.randn(B, num_tables * d, requires_grad=True)
            y = torch.rand(B).round()

            def step(i, x=x, emb=emb, y=y, arch=arch, opt=opt):
                emb.grad = None
                loss = loss_fn(arch(x, emb), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            mlp = spec.flops_per_sample - spec.interaction_flops_per_sample
            pts.append({"dim": d, "batch": B, "flops": 3 * B * mlp,
                        "interaction": B * spec.interaction_per_sample,
                        "seconds": median_time(step, max(cfg.reps, 5))})
            progress()
    return pts
