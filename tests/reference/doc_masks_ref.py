"""data.eod_mask_loss / data.reset_position_ids for the PyTorch reference (gpt_ref.py): Megatron's
get_ltor_masks_and_position_ids written out as Megatron writes it, and a training step whose loss is
the masked token losses of the global batch divided by the number of tokens that count."""
import torch
import torch.nn.functional as F

import moe_ref  # tests/reference/moe_ref.py


def megatron_masks_and_positions(tokens, eod, reset_position_ids, eod_mask_loss):
    """Megatron's get_ltor_masks_and_position_ids for inputs (B, T): loss mask 0 where the input
    token is EOD; positions restarting after each EOD (the loop over EOD indices as Megatron writes it)."""
    B, T = tokens.shape
    loss_mask = torch.ones(B, T, dtype=torch.float64)
    if eod_mask_loss:
        loss_mask[tokens == eod] = 0.0
    position_ids = torch.arange(T, dtype=torch.long).unsqueeze(0).repeat(B, 1)
    if reset_position_ids:
        for b in range(B):
            eod_index = position_ids[b, tokens[b] == eod].clone()
            prev_index = 0
            for j in range(eod_index.numel()):
                i = int(eod_index[j])
                position_ids[b, (i + 1):] -= (i + 1 - prev_index)
                prev_index = i + 1
    return loss_mask, position_ids


def train_step_doc(model, opt, micro_batches, lr, clip_grad, eod, reset_position_ids, eod_mask_loss):
    """train_step with data.eod_mask_loss / data.reset_position_ids: the loss is the sum of the
    masked token losses over the global batch divided by the number of tokens that count."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=False)
    masks = [megatron_masks_and_positions(mb[:, :-1], eod, reset_position_ids, eod_mask_loss) for mb in micro_batches]
    counted = max(1.0, float(sum(m.sum() for m, _ in masks)))
    total = 0.0
    moe = moe_ref.StepStats(model.moe_layers())     # MoE balancing losses: 1 / M each (docs/MOE.md)
    for i, (mb, (mask, pos)) in enumerate(zip(micro_batches, masks)):
        moe.prepare(i, len(micro_batches),
                    lambda j: model(micro_batches[j][:, :-1], masks[j][1] if reset_position_ids else None))
        logits = model(mb[:, :-1], pos if reset_position_ids else None)
        V = logits.shape[-1]
        ce = F.cross_entropy(logits.reshape(-1, V), mb[:, 1:].reshape(-1), reduction="none")
        loss = (ce * mask.reshape(-1).to(ce.dtype)).sum() / counted
        (loss + moe.objective_terms() / len(micro_batches)).backward()
        total += float(loss.detach())
    model.moe_stats = moe.finish() if moe.layers else {}
    from gpt_ref import clip_and_step  # tests/reference/gpt_ref.py (imports this module lazily)
    return total, clip_and_step(model, opt, clip_grad)
