"""The mass rule: LA tiles and CA pages chosen so that what they drop is bounded, from the same probability bands
as the paper rule (`statistics.probability_bands`), in the same bits format.

- LA: for every (head, document query row), the row's attention mass per tile of the document's keys (its
  probabilities normalised over every key it sees, prefix included). The diagonal tile is always computed; of the
  others the row needs the fewest, heaviest first, that leave at most ε of its mass outside (`fewest_kept`). A
  tile is set when any row of its tile row needs it, so every row drops at most ε (the prefix is always computed).
- CA: for every (head, key), the mean probability the document's later queries give it (the attention a query
  that comes after the document is expected to pay it: the proxy the paper's γ rule also counts); per head the
  fewest pages, heaviest first, that leave at most a share ε' of that mass outside.

"Fewest, heaviest first" is the smallest set meeting the bound for that row (or head): no set of fewer tiles
keeps as much mass. docs/evaluation.md ("The mass rule") says why the per-row bound is the one that matters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bits import n_pages


def fewest_kept(mass: torch.Tensor, budget: torch.Tensor | float) -> torch.Tensor:
    """bool like `mass` [..., n]: per last-axis vector, the fewest entries, heaviest first, such that the mass of
    the others is ≤ budget (a float, or a tensor broadcast against [..., 1])."""
    return fewest_kept_each(mass, [budget])[0]


def fewest_kept_each(mass: torch.Tensor, budgets) -> list[torch.Tensor]:
    """`fewest_kept` for each budget of `budgets`, the mass sorted once.

    Sorted heaviest first, an entry is kept exactly when it and every lighter one together exceed the budget (the
    rest after the entries before it would not yet be within it); the lighter-first sum is the accurate one."""
    ordered, order = mass.sort(dim=-1, descending=True, stable=True)
    tail = ordered.flip(-1).cumsum(-1).flip(-1)  # this entry's mass and every lighter one's
    return [torch.zeros_like(tail, dtype=torch.bool).scatter_(-1, order, tail > b) for b in budgets]


def row_tile_mass(doc_probs: torch.Tensor, tile: int) -> torch.Tensor:
    """[h, R, C] probabilities (non-causal entries exactly 0) → [h, R, ceil(C/T)] each row's mass per key tile."""
    h, R, C = doc_probs.shape
    cols = -(-C // tile) * tile
    if cols != C:
        doc_probs = F.pad(doc_probs, (0, cols - C))
    return doc_probs.view(h, R, cols // tile, tile).sum(-1)


def band_mass_tiles(doc_probs: torch.Tensor, r0: int, tile: int, epsilons) -> list[torch.Tensor]:
    """Per ε of `epsilons`, bool [h, ceil(R/T), ceil(C/T)]: the off-diagonal tiles some row of each tile row of the
    band needs for its dropped mass to stay ≤ ε (the band starts at document row r0, a multiple of the tile)."""
    mass = row_tile_mass(doc_probs, tile)
    h, R, nc = mass.shape
    rows = torch.arange(R, device=mass.device)
    mass[:, rows, (r0 + rows) // tile] = 0.0  # the diagonal tile is always computed: nothing of it is dropped
    rows_pad = -(-R // tile) * tile
    out = []
    for need in fewest_kept_each(mass, epsilons):
        if rows_pad != R:
            need = F.pad(need, (0, 0, 0, rows_pad - R), value=False)
        out.append(need.view(h, rows_pad // tile, tile, nc).any(2))
    return out


def column_mass(doc_probs: torch.Tensor) -> torch.Tensor:
    """[h, R, C] → [h, C]: the band's probability sum per key column (summed over bands, then divided by the
    number of queries that see each key, it is the mean the CA rule ranks)."""
    return doc_probs.sum(1)


def mass_pages(col_sum: torch.Tensor, n_doc: int, tile: int, ca_epsilon: float) -> torch.Tensor:
    """bool [H, P]: per head the fewest pages, heaviest first, whose complement holds ≤ ca_epsilon of the
    document's mean later-query mass (col_sum [H, n_doc]: every later query's probability of each key, summed)."""
    H = col_sum.shape[0]
    P = n_pages(n_doc, tile)
    visible = (n_doc - torch.arange(n_doc, device=col_sum.device)).float()  # queries i >= j that see key j
    mean = F.pad(col_sum / visible, (0, P * tile - n_doc))
    pages = mean.view(H, P, tile).sum(-1)
    return fewest_kept(pages, ca_epsilon * pages.sum(-1, keepdim=True))
