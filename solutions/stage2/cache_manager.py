"""第 2.2 章 cache_manager：按需分配 KV 页面的 ``CacheManager``。

第 2.1 章给每个请求槽静态分了一段页面：短请求用不完，长请求又借不到别人的。这一章改成：

- **按需分配**：每一步只给这一步要写的位置分配页面（``page_size`` 个 token 一页，整页地分）；
- **回收**：请求一结束，它的页面回到空闲池；
- **准入时预留**：新请求要等到“运行中的请求将来还要的页面”都预留好之后，剩下的还放得下它，
  才被接纳——否则它先等着（不会死锁：运行中的请求总能跑完并释放页面）；
- **前缀缓存接口**：缓存管理器通过一个前缀缓存对象决定哪些页面可以复用。本章的 ``naive``
  缓存什么都不缓存；第 2.3 章的 radix 缓存实现同一套接口；
- **完整性检查**：空闲时，空闲页 + 缓存里的页 == 总页数，而且没有残留的锁。

en: Chapter 2.2 cache_manager: a ``CacheManager`` that allocates KV pages on demand.

Chapter 2.1 gave each request slot a fixed range of pages: a short request leaves part of it unused, and a long one
cannot borrow from others. This chapter changes that:

- **allocation on demand**: each step allocates pages only for the positions it writes (``page_size`` tokens per page,
  whole pages);
- **reclaiming**: when a request finishes, its pages go back to the free pool;
- **reservation at admission**: a new request is admitted only if it still fits after the pages that running requests
  will need are reserved; otherwise it waits (no deadlock: running requests can always finish and free their pages);
- **the prefix-cache interface**: the cache manager asks a prefix-cache object which pages can be reused. This chapter's
  ``naive`` cache caches nothing; the radix cache of chapter 2.3 implements the same interface;
- **integrity check**: when idle, free pages + cached pages == total pages, and no lock is left.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch

from minisgl.i18n import tr
from minisgl.core import Req
from minisgl.engine import Engine
from minisgl.scheduler import PrefillAdder
from minisgl.scheduling import PendingReq, SchedulerConfig, SchedulerParts, TableManager, div_ceil


# ---------------------------------------------------------------------------- 前缀缓存的接口
# en: ---------------------------------------------------------------------------- the prefix cache's interface


@dataclass(frozen=True)
class BaseCacheHandle:
    """前缀缓存命中（或插入）的结果：前 ``cached_len`` 个 token 的 K/V 已在缓存里。

    en: The result of a prefix-cache hit (or insert): the K/V of the first ``cached_len`` tokens are in the cache.
    """

    cached_len: int

    def get_matched_indices(self) -> torch.Tensor:
        """命中部分的 token 级槽位（``cached_len`` 个），可以直接写进页表。

        en: The token-level slots of the hit part (``cached_len`` of them), ready to write into the page table.
        """
        raise NotImplementedError


class SizeInfo(NamedTuple):
    """前缀缓存占着的 token 数：没人用、可以驱逐的 + 正被请求锁着的。

    en: Tokens held by the prefix cache: unused and evictable + locked by running requests.
    """

    evictable_size: int
    protected_size: int

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class InsertResult(NamedTuple):
    # 插入前缓存里就已经有的长度（这部分请求自己的页面是重复的，要释放）
    # en: the length already cached before the insert (the request's own pages for this part are duplicates and must be
    # en: freed)
    cached_len: int
    handle: BaseCacheHandle  # 插入后覆盖整段前缀的句柄 | en: a handle covering the whole prefix after the insert


class BasePrefixCache(ABC):
    """前缀缓存：记住算过的前缀用的是哪些槽位，下次同样的前缀直接复用。

    en: Prefix cache: remembers which slots a computed prefix uses, so the same prefix can reuse them next time.
    """

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> BaseCacheHandle:
        """最长的已缓存前缀。返回的槽位只在句柄被锁住时才安全（否则可能被驱逐）。

        en: The longest cached prefix. The slots it returns are safe only while the handle is locked (otherwise they may
        be evicted).
        """

    @abstractmethod
    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """把 ``input_ids`` 这段前缀及其槽位 ``indices`` 放进缓存（只放整页）。

        en: Put the prefix ``input_ids`` and its slots ``indices`` into the cache (whole pages only).
        """

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """锁住（或解锁）句柄覆盖的前缀：锁着的不会被驱逐。

        en: Lock (or unlock) the prefix a handle covers: a locked prefix is never evicted.
        """

    @abstractmethod
    def evict(self, size: int) -> torch.Tensor:
        """驱逐至少 ``size`` 个 token（整页），返回腾出来的槽位。

        en: Evict at least ``size`` tokens (whole pages) and return the freed slots.
        """

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """重新清点缓存，账目不对就抛 RuntimeError。

        en: Count the cache again; raise RuntimeError if the totals do not match.
        """


@dataclass(frozen=True)
class NaiveCacheHandle(BaseCacheHandle):
    cached_len: int = 0

    def get_matched_indices(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int32)


class NaivePrefixCache(BasePrefixCache):
    """什么都不缓存：每个请求都从头算，页面用完就还。

    en: Caches nothing: every request computes from scratch, and its pages go back once it is done.
    """

    def match_prefix(self, input_ids: torch.Tensor) -> BaseCacheHandle:
        return NaiveCacheHandle()

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        return InsertResult(0, NaiveCacheHandle())

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        pass

    def evict(self, size: int) -> torch.Tensor:
        if size > 0:
            raise RuntimeError(tr(
                "The naive cache has no evictable pages, yet {size} tokens must be evicted",
                size=size,
            ))
        return torch.empty(0, dtype=torch.int32)

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(0, 0)

    def check_integrity(self) -> None:
        pass


# ---------------------------------------------------------------------------- 缓存管理器
# en: ---------------------------------------------------------------------------- the cache manager


class CacheManager:
    """管理 KV 池里的页面：空闲页、按需分配、请求结束时交给前缀缓存或回收。

    ``free_slots`` 存每个空闲页的第一个槽位（页号 * page_size），页表里存的则是 token 级槽位。

    en: Manages the pages of the KV pool: the free pages, allocation on demand, and handing a finished request's pages
    to the prefix cache or back to the pool.

    ``free_slots`` holds the first slot of each free page (page number * page_size); the page table holds token-level
    slots.
    """

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, prefix_cache: BasePrefixCache):
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.device = page_table.device
        self.prefix_cache = prefix_cache
        self.free_slots = torch.arange(num_pages, dtype=torch.int32, device=self.device) * page_size
        self.max_req_tokens = num_pages * page_size

    # ---------------------------------------------------------------- 查询与加锁
    # en: ---------------------------------------------------------------- lookup and locking

    @property
    def available_size(self) -> int:
        """现在最多能腾出多少个 token 的位置：空闲页 + 可驱逐的缓存。

        en: How many token positions can be made available now: free pages + the evictable part of the cache.
        """
        return len(self.free_slots) * self.page_size + self.prefix_cache.size_info.evictable_size

    def tokens_needed(self, total_len: int, cached_len: int) -> int:
        """长度从 ``cached_len`` 长到 ``total_len`` 还要新分配多少个 token 的位置（按整页算）。

        en: How many token positions must be newly allocated to grow from ``cached_len`` to ``total_len`` (in whole
        pages).
        """
        return (div_ceil(total_len, self.page_size) - div_ceil(cached_len, self.page_size)) * self.page_size

    def reserved_tokens(self, claims: Sequence[tuple[int, int]]) -> int:
        """请求将来还要新分配的 token 位置总数（``claims``：每个占着槽位的请求一对 ``(总长度, 已缓存长度)``）。

        en: Total token positions requests will still need allocated (``claims``: one ``(total length, cached length)``
        pair per request holding a slot).
        """
        return sum(self.tokens_needed(total, cached) for total, cached in claims)

    def pages_in_use(self) -> int:
        """按需分配以后，被占用的就是不在空闲池里的页（请求正用着的 + 前缀缓存占着的）。

        en: With allocation on demand, the pages in use are those not in the free pool (used by requests + held by the
        prefix cache).
        """
        return self.num_pages - len(self.free_slots)

    def match_req(self, pending: PendingReq) -> BaseCacheHandle:
        """最多匹配到倒数第二个 token：最后一个 token 总要算一遍，才有 logits 可以采样。

        en: Match at most up to the second-to-last token: the last token must always be computed, to have logits to
        sample from.
        """
        return self.prefix_cache.match_prefix(pending.input_ids[: pending.input_len - 1])

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=False)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    # ---------------------------------------------------------------- 分配与释放
    # en: ---------------------------------------------------------------- allocating and freeing

    def _allocate(self, num_pages: int) -> torch.Tensor:
        """取出 ``num_pages`` 个空闲页（返回各页第一个槽位）；空闲页不够就先从前缀缓存驱逐。

        en: Take ``num_pages`` free pages (returns the first slot of each); if there are not enough, evict from the
        prefix cache first.
        """
        # >>> TASK allocate_pages: 从空闲池取出 num_pages 页，返回各页的第一个槽位（取出的页不再留在 free_slots 里）；空闲页不够时，先让前缀缓存驱逐恰好差的那些（驱逐按 token 数计，返回 token 级槽位），腾出的页按 _free 的存法回到空闲池；还是不够就抛 RuntimeError
        # en: take num_pages pages out of the pool and return the first slot of each (they no longer stay in free_slots); when the pool is short, first have the prefix cache give up exactly the shortfall (counted in tokens; it returns token-level slots) and put those pages back in the pool the way _free stores them; if it is still short, raise RuntimeError
        # hint1: 空闲池存的是页首，驱逐给回来的却是每个 token 一个槽位：按 page_size 跳着取，才能放回空闲池。驱逐的量按 token 算：缺的页数乘 page_size。
        # en1: The pool stores page starts, but eviction hands back one slot per token: take every page_size-th one before putting them back.
        # en1: The amount to evict is in tokens: missing pages times page_size.
        # hint2: 1. free = len(self.free_slots)；num_pages > free 时 evicted = self.prefix_cache.evict((num_pages - free) * self.page_size)，
        # hint2: self.free_slots = torch.cat([self.free_slots, evicted[::self.page_size].to(self.free_slots)])；
        # hint2: 2. num_pages 仍大于 len(self.free_slots) 就 raise RuntimeError（说明“准入控制错了”）；
        # hint2: 3. allocated = self.free_slots[:num_pages]；self.free_slots = self.free_slots[num_pages:]；return allocated。
        # en2: 1. free = len(self.free_slots); if num_pages > free: evicted = self.prefix_cache.evict((num_pages - free) * self.page_size),
        # en2: self.free_slots = torch.cat([self.free_slots, evicted[::self.page_size].to(self.free_slots)]);
        # en2: 2. if num_pages is still above len(self.free_slots), raise RuntimeError ("admission control is wrong");
        # en2: 3. allocated = self.free_slots[:num_pages]; self.free_slots = self.free_slots[num_pages:]; return allocated.
        free = len(self.free_slots)
        if num_pages > free:
            evicted = self.prefix_cache.evict((num_pages - free) * self.page_size)
            self.free_slots = torch.cat([self.free_slots, evicted[:: self.page_size].to(self.free_slots)])
        if num_pages > len(self.free_slots):
            raise RuntimeError(tr(
                "Not enough KV pages: {num_pages} pages wanted, only {n_free} free (admission control is wrong)",
                num_pages=num_pages, n_free=len(self.free_slots),
            ))
        allocated = self.free_slots[:num_pages]
        self.free_slots = self.free_slots[num_pages:]
        return allocated
        # <<< TASK

    def _free(self, indices: torch.Tensor) -> None:
        """归还一段页对齐的 token 级槽位（取每页的第一个槽位放回空闲池）。

        en: Give back page-aligned token-level slots (the first slot of each page goes back to the free pool).
        """
        if len(indices) > 0:
            self.free_slots = torch.cat([self.free_slots, indices[:: self.page_size].to(self.free_slots)])

    def free_tail(self, table_idx: int, keep_len: int, end_len: int) -> None:
        """一个请求把 K/V 写得比它留下的远（投机解码没被接受的草稿）：只装着位置 ``[keep_len, end_len)`` 的页还回去。
        之后它的页又正好是前 ``div_ceil(keep_len, page_size)`` 页，和 ``allocate_paged`` 的约定一致。

        en: A request wrote K/V further than it keeps (speculative decoding's rejected drafts): give back the pages that
        hold only positions ``[keep_len, end_len)``. Its pages are then exactly the first ``div_ceil(keep_len,
        page_size)``, as ``allocate_paged`` assumes.
        """
        start, end = div_ceil(keep_len, self.page_size) * self.page_size, div_ceil(end_len, self.page_size) * self.page_size
        if end > start:
            self._free(self.page_table[table_idx, start:end])

    def _page_to_token(self, pages: torch.Tensor) -> torch.Tensor:
        """各页第一个槽位 → 这些页里的全部槽位。

        en: First slot of each page -> every slot of those pages.
        """
        if self.page_size == 1:
            return pages
        offsets = torch.arange(self.page_size, dtype=pages.dtype, device=pages.device)
        return (pages[:, None] + offsets).flatten()

    def allocate_paged(self, reqs: Sequence[Req]) -> None:
        """为这一步要写 K/V 的位置 ``[cached_len, device_len)`` 补齐页面，并写进页表。

        已经分到的页是前 ``div_ceil(cached_len, page_size)`` 页；要一直分到第 ``div_ceil(device_len, page_size)`` 页。

        en: Allocate the missing pages for the positions ``[cached_len, device_len)`` this step writes K/V to, and write
        them into the page table.

        The pages already allocated are the first ``div_ceil(cached_len, page_size)``; allocation goes up to page
        ``div_ceil(device_len, page_size)``.
        """
        # >>> TASK allocate_paged: 给每个请求这一步要写 K/V 的位置 [cached_len, device_len) 补齐缺的整页（已经分到的页不再分），新页的 token 级槽位写进页表里它那一行的对应列：同一页里的位置槽位连续；伸出页表宽度的列不写，但那一页照样要分；别的行、别的列不动。给定：_allocate（返回页首）、_page_to_token、div_ceil
        # en: for each request, add the whole pages missing for the positions [cached_len, device_len) it writes K/V at this step (pages it already has are not allocated again), and write the new pages' token-level slots into its row of the page table at the matching columns: positions in one page get consecutive slots; columns past the page table's width are not written, but that page is still allocated; other rows and columns stay as they are. Given: _allocate (returns page starts), _page_to_token, div_ceil
        # hint1: 一个请求已有的页数和需要的页数都是“长度按页向上取整”，可能一页都不缺。整批先算出一共要几页，只调一次 _allocate，
        # hint1: 再把槽位按（行, 列）两个索引张量一次写进页表。
        # en1: The pages a request has and the pages it needs are both "length rounded up to pages"; it may need none. Work out how many pages the whole batch needs,
        # en1: call _allocate once, then write the slots into the page table in one go with two index tensors (rows, columns).
        # hint2: 1. ps = self.page_size；对每个请求：first, last = div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)；last > first 时记下 (req.table_idx, first * ps, last * ps)；
        # hint2: 2. 一段都没有就 return；slots = self._page_to_token(self._allocate(各段长度之和 // ps))；
        # hint2: 3. rows = 各段 torch.full((段长,), 行号) 拼起来，cols = 各段 torch.arange(起, 止) 拼起来（都用 int64）；
        # hint2: 4. keep = cols < self.page_table.shape[1]，rows、cols、slots 都按 keep 过滤（slots 用 keep 搬到它的设备上）；
        # hint2: 5. self.page_table[rows.to(self.device), cols.to(self.device)] = slots。
        # en2: 1. ps = self.page_size; for each request: first, last = div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps); if last > first, note (req.table_idx, first * ps, last * ps);
        # en2: 2. if nothing was noted, return; slots = self._page_to_token(self._allocate(total span length // ps));
        # en2: 3. rows = torch.full((span length,), row) of each span concatenated, cols = torch.arange(start, end) of each span concatenated (both int64);
        # en2: 4. keep = cols < self.page_table.shape[1]; filter rows, cols and slots by keep (moving keep to the device of slots for the latter);
        # en2: 5. self.page_table[rows.to(self.device), cols.to(self.device)] = slots.
        ps, width = self.page_size, self.page_table.shape[1]
        spans = []
        for req in reqs:
            first, last = div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)
            if last > first:
                spans.append((req.table_idx, first * ps, last * ps))
        if not spans:
            return
        needed_pages = sum(end - start for _, start, end in spans) // ps
        slots = self._page_to_token(self._allocate(needed_pages))
        rows = torch.cat([torch.full((end - start,), row, dtype=torch.int64) for row, start, end in spans])
        cols = torch.cat([torch.arange(start, end, dtype=torch.int64) for _, start, end in spans])
        # 最后一页可能伸出页表的宽度，伸出去的位置永远用不到
        # en: the last page may reach past the page table's width; positions beyond it are never used
        keep = cols < width
        rows, cols, slots = rows[keep], cols[keep], slots[keep.to(slots.device)]
        self.page_table[rows.to(self.device), cols.to(self.device)] = slots
        # <<< TASK

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """把请求算过的前缀 ``[0, cached_len)`` 交给前缀缓存；``finished`` 时归还其余页面。

        插入时缓存里可能已经有别的请求放进去的同一段前缀（``[旧句柄长度, 已有长度)``）：
        那段请求自己的页面是重复的——先把页表这一行改指向缓存里的页面，再释放重复的页，
        否则请求接着解码时会读到被别人重新分走的页面。

        en: Hand the request's computed prefix ``[0, cached_len)`` to the prefix cache; when ``finished``, free the
        other pages.

        The cache may already hold the same prefix, put there by another request (``[old handle's length, length already
        cached)``): the request's own pages for that part are duplicates. First point this page-table row at the cache's
        pages, then free the duplicates; otherwise the request, as it keeps decoding, would read pages that were handed
        to someone else.
        """
        # >>> TASK cache_req: 把请求算过的前缀（前 cached_len 个 token 和页表里它们的槽位）插进前缀缓存。缓存里早已有、它却自己又算了一遍的那段：页表这一行改指缓存里的槽位，它自己原来那份页还回空闲池（还的是原来的槽位，不是改指后的）。结束时（finished）：放开它原来的锁，把插入没留下的尾巴还掉，只还到 cached_len 为止（再往后的列是残留，不是它的）；没结束：锁住插入得到的新句柄、放开旧的，请求改持新句柄。给定：insert_prefix、lock / unlock、_free
        # en: insert the prefix the request has computed (its first cached_len tokens and their slots in the page table) into the prefix cache. For a part the cache already held but the request computed again, point this page-table row at the cache's slots and put the request's own copies back in the pool (its original slots, not the repointed ones). When finished: release its old lock and give back the tail the insert did not keep, only as far as cached_len (columns past it hold stale slots that are not its own); otherwise lock the new handle the insert returned, unlock the old one, and let the request hold the new handle. Given: insert_prefix, lock / unlock, _free
        # hint1: 插入返回的第一个数是“插入前缓存里已有多长”，它比旧句柄长出来的那一段就是重复的。从页表切出来的是视图：改指之前先 clone 一份要还的槽位。
        # en1: The first value the insert returns is how much was cached before it; the part beyond the old handle's length is the duplicate.
        # en1: A slice of the page table is a view: clone the slots to give back before repointing.
        # hint2: 1. row, old = req.table_idx, req.cache_handle；indices = self.page_table[row, :req.cached_len]；
        # hint2: 2. dup_end, new_handle = self.prefix_cache.insert_prefix(req.input_ids[:req.cached_len], indices)；
        # hint2: 3. dup_end > old.cached_len 时：duplicate = indices[old.cached_len:dup_end].clone()；
        # hint2: self.page_table[row, old.cached_len:dup_end] = new_handle.get_matched_indices()[old.cached_len:dup_end].to(indices)；self._free(duplicate)；
        # hint2: 4. finished：self.unlock(old)；self._free(self.page_table[row, new_handle.cached_len:req.cached_len])；
        # hint2: 5. 否则：self.lock(new_handle)；self.unlock(old)；req.cache_handle = new_handle。
        # en2: 1. row, old = req.table_idx, req.cache_handle; indices = self.page_table[row, :req.cached_len];
        # en2: 2. dup_end, new_handle = self.prefix_cache.insert_prefix(req.input_ids[:req.cached_len], indices);
        # en2: 3. if dup_end > old.cached_len: duplicate = indices[old.cached_len:dup_end].clone();
        # en2: self.page_table[row, old.cached_len:dup_end] = new_handle.get_matched_indices()[old.cached_len:dup_end].to(indices); self._free(duplicate);
        # en2: 4. if finished: self.unlock(old); self._free(self.page_table[row, new_handle.cached_len:req.cached_len]);
        # en2: 5. otherwise: self.lock(new_handle); self.unlock(old); req.cache_handle = new_handle.
        row, old_handle = req.table_idx, req.cache_handle
        indices = self.page_table[row, : req.cached_len]
        dup_end, new_handle = self.prefix_cache.insert_prefix(req.input_ids[: req.cached_len], indices)
        if dup_end > old_handle.cached_len:
            duplicate = indices[old_handle.cached_len : dup_end].clone()
            matched = new_handle.get_matched_indices()[old_handle.cached_len : dup_end]
            self.page_table[row, old_handle.cached_len : dup_end] = matched.to(indices)
            self._free(duplicate)
        if finished:
            self.unlock(old_handle)
            self._free(self.page_table[row, new_handle.cached_len : req.cached_len])
        else:
            self.lock(new_handle)
            self.unlock(old_handle)
            req.cache_handle = new_handle
        # <<< TASK

    # ---------------------------------------------------------------- 检查
    # en: ---------------------------------------------------------------- checks

    def check_integrity(self) -> None:
        """空闲时调用：前缀缓存自查；没有残留的锁；空闲页不重复、页对齐；空闲页 + 缓存页 == 总页数。

        en: Call when idle: the prefix cache checks itself; no lock is left; free pages are unique and page-aligned;
        free pages + cached pages == total pages.
        """
        self.prefix_cache.check_integrity()
        # >>> TASK check_integrity: 空闲时对账，下面任何一条不成立就抛 RuntimeError：前缀缓存里没有受保护（还锁着）的 token；空闲池里没有重复的项；每一项都是某一页的页首，而且在 KV 池之内（不小于 0、小于总槽位数）；空闲页数加上缓存占的页数（缓存里的 token 总数 ÷ 每页的 token 数）正好等于总页数。给定：self.prefix_cache.size_info
        # en: the idle-time audit; raise RuntimeError if any of these fails: the prefix cache has no protected (still locked) tokens; the free pool has no repeated entries; every entry is the start of a page inside the KV pool (not below 0, below the total number of slots); free pages plus the pages the cache holds (its total tokens / tokens per page) equal the total number of pages. Given: self.prefix_cache.size_info
        # hint1: free_slots 可能在设备上，先拿到 CPU 上再查。“页首”就是能被 page_size 整除；下界 0 也要查——page_size=1 时 -1 也能“整除”。
        # en1: free_slots may live on the device: bring it to the CPU first.
        # en1: "Page start" means divisible by page_size; check the lower bound 0 too, since with page_size=1 even -1 is "divisible".
        # hint2: 1. info = self.prefix_cache.size_info；info.protected_size != 0 就抛；
        # hint2: 2. free = self.free_slots.cpu()；len(torch.unique(free)) != len(free) 就抛；
        # hint2: 3. 有任何一项 free % self.page_size != 0、free < 0 或 free >= self.num_pages * self.page_size 就抛；
        # hint2: 4. len(free) + info.total_size // self.page_size != self.num_pages 就抛。消息像文件里别处一样用 tr(...) 包起来。
        # en2: 1. info = self.prefix_cache.size_info; raise if info.protected_size != 0;
        # en2: 2. free = self.free_slots.cpu(); raise if len(torch.unique(free)) != len(free);
        # en2: 3. raise if any entry has free % self.page_size != 0, free < 0 or free >= self.num_pages * self.page_size;
        # en2: 4. raise if len(free) + info.total_size // self.page_size != self.num_pages. Wrap the messages in tr(...) like the rest of the file.
        info = self.prefix_cache.size_info
        if info.protected_size != 0:
            raise RuntimeError(tr(
                "While idle, {protected_size} tokens in the prefix cache are still locked (some request was not "
                "unlocked)",
                protected_size=info.protected_size,
            ))
        free = self.free_slots.cpu()
        if len(torch.unique(free)) != len(free):
            raise RuntimeError(tr("Duplicate free pages: the same page was freed more than once"))
        if bool(((free % self.page_size) != 0).any()) or bool(((free < 0) | (free >= self.num_pages * self.page_size)).any()):
            raise RuntimeError(tr(
                "The free pool holds slots that are not the first slot of a page, or lie outside the KV pool",
            ))
        cached_pages = info.total_size // self.page_size
        if len(free) + cached_pages != self.num_pages:
            raise RuntimeError(
                tr(
                    "The page count does not add up: {n_free} free pages + {cached_pages} cached pages != {num_pages} "
                    "pages in total (a page leaked or was freed twice)",
                    n_free=len(free), cached_pages=cached_pages, num_pages=self.num_pages,
                )
            )
        # <<< TASK


# ---------------------------------------------------------------------------- 接入调度器
# en: ---------------------------------------------------------------------------- wiring into the scheduler


class ReservingPrefillAdder(PrefillAdder):
    """准入时除了请求槽，还要预留 KV 页面：运行中的请求将来要的（``reserved_size``）先留着，剩下的放得下才接纳。

    en: Admission needs KV pages as well as a request slot: what running requests will still need (``reserved_size``) is
    set aside first, and a request is admitted only if it fits in the rest.
    """

    def _try_allocate_one(self, pending: PendingReq) -> tuple[Any, int, int] | None:
        # >>> TASK reserve: 准入一个请求：要有空的请求槽，而且它还要新分的 token 数（提示词 + 输出，已命中的前缀不算，按整页）加上 reserved_size 不超过可用空间——锁住命中的前缀之后这一条还得成立（锁住的页不再算可驱逐）。不接纳就返回 None，而且什么都没变（不留锁、不占槽、预留不变）；接纳时命中的前缀保持锁着、reserved_size 加上它要的数、占一个请求槽、命中的槽位写进页表那一行的开头，返回（句柄, 槽号, 已缓存长度）。给定：match_req、tokens_needed、available_size、lock / unlock
        # en: admit a request only if a request slot is free and the tokens it still needs (prompt + output, minus the matched prefix, in whole pages) plus reserved_size fit in what is available, and this must still hold after the matched prefix is locked (locked pages stop counting as evictable). On refusal return None with nothing changed (no lock kept, no slot taken, the reservation as it was); on admission the prefix stays locked, reserved_size grows by what it needs, a request slot is taken and the matched slots are written at the start of that page-table row; return (the match, slot, cached length). Given: match_req, tokens_needed, available_size, lock / unlock
        # hint1: 为什么比两次：锁住之前，命中的那些页还算在“可驱逐”里，available_size 偏大。第二次不过时，要先解锁再返回 None。
        # hint1: 查请求槽放在最前面；真正占槽、改 reserved_size 要等两次比较都过了之后。
        # en1: Why compare twice: before locking, the matched pages still count as evictable, so available_size is too large. If the second check fails, unlock before returning None.
        # en1: Check for a request slot first of all; take the slot and change reserved_size only after both checks pass.
        # hint2: 1. self.table_manager.available_size == 0 就 return None；cm = self.cache_manager；
        # hint2: 2. handle = cm.match_req(pending)；cached_len = handle.cached_len；needed = cm.tokens_needed(pending.input_len + pending.output_len, cached_len)；
        # hint2: 3. needed + self.reserved_size > cm.available_size 就 return None；
        # hint2: 4. cm.lock(handle)；再比一次，不过就 cm.unlock(handle) 再 return None；
        # hint2: 5. self.reserved_size += needed；table_idx = self.table_manager.allocate()；
        # hint2: 6. cached_len > 0 时 cm.page_table[table_idx, :cached_len] = handle.get_matched_indices().to(cm.device)；return handle, table_idx, cached_len。
        # en2: 1. if self.table_manager.available_size == 0: return None; cm = self.cache_manager;
        # en2: 2. handle = cm.match_req(pending); cached_len = handle.cached_len; needed = cm.tokens_needed(pending.input_len + pending.output_len, cached_len);
        # en2: 3. if needed + self.reserved_size > cm.available_size: return None;
        # en2: 4. cm.lock(handle); compare again, and if it fails, cm.unlock(handle) and return None;
        # en2: 5. self.reserved_size += needed; table_idx = self.table_manager.allocate();
        # en2: 6. if cached_len > 0: cm.page_table[table_idx, :cached_len] = handle.get_matched_indices().to(cm.device); return handle, table_idx, cached_len.
        if self.table_manager.available_size == 0:
            return None
        handle = self.cache_manager.match_req(pending)
        cached_len = handle.cached_len
        needed = self.cache_manager.tokens_needed(pending.input_len + pending.output_len, cached_len)
        if needed + self.reserved_size > self.cache_manager.available_size:
            return None
        # 锁住以后命中的页不再算“可驱逐”，要再比一次
        # en: once locked, the hit pages no longer count as evictable, so compare again
        self.cache_manager.lock(handle)
        if needed + self.reserved_size > self.cache_manager.available_size:
            self.cache_manager.unlock(handle)
            return None
        self.reserved_size += needed
        table_idx = self.table_manager.allocate()
        if cached_len > 0:
            self.cache_manager.page_table[table_idx, :cached_len] = handle.get_matched_indices().to(self.cache_manager.device)
        return handle, table_idx, cached_len
        # <<< TASK


def paged_cache_manager(engine: Engine, config: SchedulerConfig, table_manager: TableManager) -> CacheManager:
    """本章的缓存管理器零件（一个 :data:`~minisgl.scheduling.CacheManagerFactory`）：按需分页，``naive`` 前缀缓存。

    en: This chapter's cache-manager part (a :data:`~minisgl.scheduling.CacheManagerFactory`): pages on demand, the
    ``naive`` prefix cache.
    """
    return CacheManager(engine.num_pages, config.page_size, engine.page_table, NaivePrefixCache())


#: 到本章为止的引擎：第 2.1 章的调度器换上按需分页的缓存管理器和准入时预留页面的准入员。
#: en: The engine up to this chapter: chapter 2.1's scheduler with the on-demand cache manager and the adder that
#: reserves pages at admission.
PARTS = SchedulerParts(cache_manager=paged_cache_manager, prefill_adder=ReservingPrefillAdder)
