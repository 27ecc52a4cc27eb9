"""第 2.3 章示例：直接操作一棵基数树——插入、匹配（分裂节点）、加锁、LRU 驱逐、完整性检查。

    python examples/chapters/radix_cache.py
"""

import torch

from minisgl.radix_cache import RadixPrefixCache


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def show(cache: RadixPrefixCache, title: str) -> None:
    print(f"{title}（可驱逐 {cache.size_info.evictable_size}，受保护 {cache.size_info.protected_size}）")

    def walk(node, depth):  # noqa: ANN001, ANN202
        for child in sorted(node.children.values(), key=lambda n: n.key.tolist()):
            print(f"{'    ' * depth}  ├─ key={child.key.tolist()} 槽位={child.value.tolist()} ref={child.ref_count}")
            walk(child, depth + 1)

    walk(cache.root, 0)
    cache.check_integrity()


cache = RadixPrefixCache(page_size=1)
r = cache.insert_prefix(ids(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14))
print(f"插入 [1, 2, 3, 4, 5]：插入前已有 {r.cached_len} 个")
show(cache, "树")

handle = cache.match_prefix(ids(1, 2, 3, 9))
print(f"匹配 [1, 2, 3, 9]：命中 {handle.cached_len} 个，槽位 {handle.get_matched_indices().tolist()}（节点在第 3 个 token 处分裂）")
show(cache, "分裂之后")

r = cache.insert_prefix(ids(1, 2, 3, 9, 8), ids(20, 21, 22, 23, 24))
print(f"插入 [1, 2, 3, 9, 8]：插入前已有 {r.cached_len} 个（槽位 20, 21, 22 是重复的，由调用者释放）")
cache.lock_handle(r.handle)
show(cache, "锁住 [1, 2, 3, 9, 8] 之后")

evicted = cache.evict(2)
print(f"驱逐 2 个 token：腾出槽位 {evicted.tolist()}（只有没上锁的叶子 [4, 5] 能驱逐）")
cache.lock_handle(r.handle, unlock=True)
show(cache, "解锁之后")
print(f"再驱逐 5 个：腾出槽位 {cache.evict(5).tolist()}")
show(cache, "最后")

paged = RadixPrefixCache(page_size=2)
r = paged.insert_prefix(ids(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14))
h = paged.match_prefix(ids(1, 2, 3, 7))
print(f"page_size=2：插入 5 个 token 只缓存整页 {r.handle.cached_len} 个；匹配 [1, 2, 3, 7] 命中 {h.cached_len} 个（按页向下取整）")
