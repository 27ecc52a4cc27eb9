"""第 2.3 章示例：直接操作一棵基数树——插入、匹配（分裂节点）、加锁、LRU 驱逐、完整性检查。

    python examples/chapters/radix_cache.py

en: Chapter 2.3 example: working on a radix tree directly: insert, match (splitting a node), lock, LRU eviction,
integrity check.

    python examples/chapters/radix_cache.py
"""

import torch

from minisgl.i18n import tr
from minisgl.radix_cache import RadixPrefixCache


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def show(cache: RadixPrefixCache, title: str) -> None:
    print(tr("{title} (evictable {evictable_size}, protected {protected_size})",
             title=title, evictable_size=cache.size_info.evictable_size, protected_size=cache.size_info.protected_size))

    def walk(node, depth):  # noqa: ANN001, ANN202
        for child in sorted(node.children.values(), key=lambda n: n.key.tolist()):
            print(tr("{indent}  ├─ key={key} slots={slots} ref={ref_count}",
                     indent="    " * depth, key=child.key.tolist(), slots=child.value.tolist(),
                     ref_count=child.ref_count))
            walk(child, depth + 1)

    walk(cache.root, 0)
    cache.check_integrity()


cache = RadixPrefixCache(page_size=1)
r = cache.insert_prefix(ids(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14))
print(tr("Insert [1, 2, 3, 4, 5]: {cached_len} already there before the insert", cached_len=r.cached_len))
show(cache, tr("The tree"))

handle = cache.match_prefix(ids(1, 2, 3, 9))
print(tr("Match [1, 2, 3, 9]: {cached_len} hit, slots {slots} (the node is split at the 3rd token)",
         cached_len=handle.cached_len, slots=handle.get_matched_indices().tolist()))
show(cache, tr("After the split"))

r = cache.insert_prefix(ids(1, 2, 3, 9, 8), ids(20, 21, 22, 23, 24))
print(tr("Insert [1, 2, 3, 9, 8]: {cached_len} already there before the insert (slots 20, 21, 22 are duplicates; the caller frees them)",
         cached_len=r.cached_len))
cache.lock_handle(r.handle)
show(cache, tr("After locking [1, 2, 3, 9, 8]"))

evicted = cache.evict(2)
print(tr("Evict 2 tokens: frees slots {slots} (only the unlocked leaf [4, 5] can be evicted)", slots=evicted.tolist()))
cache.lock_handle(r.handle, unlock=True)
show(cache, tr("After unlocking"))
print(tr("Evict 5 more: frees slots {slots}", slots=cache.evict(5).tolist()))
show(cache, tr("At the end"))

paged = RadixPrefixCache(page_size=2)
r = paged.insert_prefix(ids(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14))
h = paged.match_prefix(ids(1, 2, 3, 7))
print(tr("page_size=2: inserting 5 tokens caches only the {cached_len} in whole pages; matching [1, 2, 3, 7] hits {cached_len2} (rounded down to pages)",
         cached_len=r.handle.cached_len, cached_len2=h.cached_len))
