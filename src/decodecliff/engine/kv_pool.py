"""The paged latent-KV pool, its page allocator, per-request page tables and defragmentation.

One tensor [layers, num_pages, page_size, 576] holds every layer's cache. A request owns a list of
pages; token t of the request lives in row ``pages[t // page_size] * page_size + t % page_size``
(``token_slot`` of kernels/api.py). The device-side page table ``req_to_page`` [max_requests,
max_pages] mirrors those lists (one row per running request, as SGLang's req_to_token pool), so a
step gathers its page table on the device without rebuilding long lists on the host.

The free list is a stack: freed pages are pushed back in the order the request held them and popped
from the end, so after requests come and go a new request's pages run backwards and interleave with
others. ``scatter_seed`` starts from a shuffled free list, the state of a pool after long churn.
"""

from __future__ import annotations

import math
import random

import torch

from decodecliff.kernels.api import token_slot


class PoolExhausted(RuntimeError):
    """The KV pool has no free page for a request's next tokens."""


class PageAllocator:
    def __init__(self, num_pages: int, scatter_seed: int | None = None) -> None:
        self.num_pages = num_pages
        self.free_pages = list(range(num_pages - 1, -1, -1))  # pop() gives 0, 1, 2, ...
        if scatter_seed is not None:
            random.Random(scatter_seed).shuffle(self.free_pages)

    @property
    def num_free(self) -> int:
        return len(self.free_pages)

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free_pages):
            raise PoolExhausted(f"KV pool exhausted: need {n} pages, {len(self.free_pages)} free")
        taken = self.free_pages[len(self.free_pages) - n :][::-1]
        del self.free_pages[len(self.free_pages) - n :]
        return taken

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)

    def reset(self, in_use: list[int]) -> None:
        """Rebuild the free list as every page not in use, handed out in ascending order."""
        used = set(in_use)
        self.free_pages = [p for p in range(self.num_pages - 1, -1, -1) if p not in used]


def page_breaks(pages: list[int]) -> int:
    """How many times a page list jumps instead of continuing to the next page."""
    return sum(1 for a, b in zip(pages, pages[1:], strict=False) if b != a + 1)


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        row_dim: int,
        max_requests: int,
        dtype: torch.dtype,
        device: torch.device | str,
        scatter_seed: int | None = None,
    ) -> None:
        self.page_size, self.num_pages, self.row_dim = page_size, num_pages, row_dim
        self.device = torch.device(device)
        self.cache = torch.zeros(
            num_layers, num_pages, page_size, row_dim, dtype=dtype, device=device
        )
        self.max_pages_per_req = num_pages
        # Row max_requests is a scratch row for padded (graph) batch entries.
        self.req_to_page = torch.zeros(
            max_requests + 1, num_pages, dtype=torch.int32, device=self.device
        )
        self.allocator = PageAllocator(num_pages, scatter_seed)
        self.free_rows = list(range(max_requests - 1, -1, -1))
        self.owners: dict[int, list[int]] = {}  # request row -> its pages, in token order
        # page_breaks(owners[row]), kept up to date as pages come and go so that measuring
        # fragmentation does not walk every page of a long context
        self.breaks: dict[int, int] = {}

    @property
    def max_total_tokens(self) -> int:
        return self.num_pages * self.page_size

    @staticmethod
    def bytes_per_token(num_layers: int, row_dim: int, dtype: torch.dtype) -> int:
        return num_layers * row_dim * torch.empty((), dtype=dtype).element_size()

    def pages_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.page_size)

    # request lifecycle -------------------------------------------------------------------------
    def open(self) -> int:
        """Reserve a page-table row for a new request."""
        row = self.free_rows.pop()
        self.owners[row] = []
        self.breaks[row] = 0
        return row

    def reserve(self, row: int, num_tokens: int) -> None:
        """Make the request's pages cover num_tokens tokens (raises PoolExhausted, holding none)."""
        pages = self.owners[row]
        need = self.pages_for(num_tokens) - len(pages)
        if need <= 0:
            return
        new = self.allocator.alloc(need)
        start = len(pages)
        self.breaks[row] += page_breaks(pages[-1:] + new)
        pages.extend(new)
        self.req_to_page[row, start : start + need] = torch.tensor(new, dtype=torch.int32).to(
            self.device, non_blocking=True
        )

    def truncate(self, row: int, num_tokens: int) -> None:
        """Give back the pages past num_tokens tokens (rolled-back draft tokens)."""
        pages = self.owners[row]
        keep = self.pages_for(num_tokens)
        if keep < len(pages):
            self.breaks[row] -= page_breaks(pages[max(keep - 1, 0) :])
            self.allocator.free(pages[keep:])
            del pages[keep:]

    def close(self, row: int) -> None:
        self.allocator.free(self.owners.pop(row))
        del self.breaks[row]
        self.free_rows.append(row)

    def slots(self, row: int, start: int, end: int) -> list[int]:
        """Cache rows of the request's tokens start..end-1."""
        pages, ps = self.owners[row], self.page_size
        return [token_slot(pages, t, ps) for t in range(start, end)]

    def move_rows(self, src: list[int], dst: list[int]) -> None:
        """Copy cache rows src -> dst in every layer (draft-tree compaction)."""
        flat = self.cache.view(self.cache.shape[0], -1, self.row_dim)
        src_t = torch.tensor(src, device=self.device)
        dst_t = torch.tensor(dst, device=self.device)
        flat[:, dst_t] = flat[:, src_t]

    # fragmentation and defragmentation ---------------------------------------------------------
    def fragmentation(self) -> dict:
        """Page breaks per page boundary over running requests (0 = every request contiguous).

        The server reads it from its own thread while the engine's opens and closes requests:
        the page lists are copied out first (in one call, under the GIL), never iterated live.
        """
        breaks = sum(self.breaks.values())
        bounds = sum(max(len(p) - 1, 0) for p in list(self.owners.values()))
        return {
            "request_page_breaks": breaks,
            "request_fragmentation": breaks / bounds if bounds else 0.0,
            "free_pages": self.allocator.num_free,
            "num_pages": self.num_pages,
        }

    def defragment(self) -> int:
        """Move every request's pages into one contiguous run, requests back to back from page 0.

        KV rows are copied layer by layer through a temporary holding only the used pages, so a
        page that is both a source and a destination is read before it is overwritten. Returns the
        number of pages moved.
        """
        order = sorted(self.owners)
        src = [p for row in order for p in self.owners[row]]
        dst = list(range(len(src)))
        moved = sum(1 for s, d in zip(src, dst, strict=True) if s != d)
        if moved == 0:
            return 0
        src_t = torch.tensor(src, device=self.device)
        dst_t = torch.tensor(dst, device=self.device)
        for layer in self.cache:
            layer[dst_t] = layer[src_t]  # advanced indexing on the right makes a copy first
        start = 0
        for row in order:
            n = len(self.owners[row])
            self.owners[row] = dst[start : start + n]
            self.breaks[row] = 0
            self.req_to_page[row, :n] = dst_t[start : start + n].to(torch.int32)
            start += n
        self.allocator.reset(dst)
        return moved
