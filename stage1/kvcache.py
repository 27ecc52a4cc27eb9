# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint kvcache <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint kvcache <task>` gives the next hint.
"""第 1.4 章 kvcache：预先分配好的分页 KV 池、页表和 token 池。

第 0 步用 ``torch.cat`` 让每个请求的 K/V 越拼越长：每步都要重新分配、拷贝，也没法把
不同请求的 K/V 放进同一个批次。这里换成一整块预先分配的池子：

- **KV 池**：每层一块 K、一块 V，各有 ``num_pages × page_size`` 个 token 槽位；
- **页表**：``[max_running_req + 1, max_seq_len]`` 的 int32，第 ``table_idx`` 行第 ``pos`` 列
  是那个请求第 ``pos`` 个 token 的 K/V 所在的槽位（页号 * page_size + 页内偏移）；
- **token 池**：形状同页表，存每个位置的 token id，解码的输入直接在设备上按行列取出。

页表按 token 记槽位，所以注意力后端查表时不必关心 ``page_size``；``page_size`` 只决定
槽位怎样成组地分配出去（第 2 阶段的缓存管理器按页分配和回收）。

en: Chapter 1.4 kvcache: a preallocated paged KV pool, the page table and the token pool.

Step 0 let each request's K/V grow with ``torch.cat``: every step reallocates and copies, and the K/V of different
requests cannot go into one batch. Here they are replaced by one preallocated pool:

- **KV pool**: one K block and one V block per layer, each with ``num_pages × page_size`` token slots;
- **page table**: int32 ``[max_running_req + 1, max_seq_len]``; row ``table_idx``, column ``pos`` is the slot holding
  the K/V of that request's token ``pos`` (page number * page_size + offset in the page);
- **token pool**: same shape as the page table, holding the token id at each position; decode inputs are taken from it
  by row and column, on the device.

The page table records slots per token, so the attention backend need not care about ``page_size`` when it looks them
up; ``page_size`` only decides how slots are handed out in groups (stage 2's cache manager allocates and frees whole
pages).
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import torch


class MHAKVCache:
    """多头注意力的 KV 池：一整块预先分配的张量，每层的 K 和 V 各是其中的一块 ``[num_pages × page_size, KV 头数,
    head_dim]``（第 s 行是第 s 个槽位），由 ``k_cache`` / ``v_cache`` 以视图交出。这块张量里怎么摆（K 和 V、各层、
    各页谁在外谁在里）由实现决定；约定只有：一次分配；每层的 K、V 视图各自在内存里连续（融合解码和注意力核把一层的
    K 当一整块读），互不重叠，写视图就是写池子。

    用 ``torch.empty`` 分配、不填 0：填 0 要把整块内存逐页碰一遍，启动变慢，CPU 上整个池子立刻计入进程内存；
    不填则只有真正写过的页才占物理内存。没写过的槽位里可能是任何值（包括 NaN），所以注意力只读写过的槽位：
    参考后端只取前 ``seq_len`` 个；SDPA 后端把补齐的 key 指向本请求的第一个槽位（被掩掉的 key 权重是 0，
    但 ``0 × NaN`` 仍是 NaN）。CUDA 上（以及 CUDA 图路径）引擎另行把池子清零，见 ``Engine``。

    en: The KV pool for multi-head attention: one preallocated tensor; each layer's K and V is a block of it,
    ``[num_pages × page_size, KV heads, head_dim]`` (row s is slot s), handed out as views by ``k_cache`` /
    ``v_cache``. How the tensor is laid out (which of K and V, layers and pages is outer, which inner) is the
    implementation's choice; the contract is only: one allocation; each layer's K view and V view contiguous in memory
    (the fused decode and attention kernels read a layer's K as one block), never overlapping, and writing a view writes
    the pool.

    Allocated with ``torch.empty``, not filled with 0: filling touches the whole block page by page, which slows the
    start and, on the CPU, makes the whole pool count in the process's memory at once; unfilled, only pages actually
    written take physical memory. An unwritten slot may hold anything (NaN included), so attention reads written slots
    only: the reference backend takes the first ``seq_len``; the SDPA backend points padded keys at the request's
    first slot (a masked key gets weight 0, but ``0 × NaN`` is still NaN). On CUDA (and on the CUDA-graph path) the
    engine zeroes the pool separately, see ``Engine``.
    """

    def __init__(
        self,
        num_kv_heads: int,
        num_layers: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        """分配整个 KV 池（只分配、不初始化内容），备好每层的 K、V 视图，并把五个尺寸参数存成同名属性。

        en: Allocate the whole KV pool (allocation only, the contents are not initialised), prepare every layer's K and
        V views, and keep the five size arguments as attributes of the same names.
        """
        # TODO 任务 kv_pool_init：建起这个 KV 池：五个尺寸参数原样存成同名属性（本类的其余方法、引擎和后面的章节都读它们）；整块池子一次分配（元素类型和设备按参数给的，不填 0，类文档写了为什么），并备好每层的 K 视图列表 self._k_views 和 V 视图列表 self._v_views（k_cache、v_cache 从这里取）。怎么摆由你设计，约定见类文档：每个视图 [槽位总数, KV 头数, 每头维度]、在内存里连续、与池子共用内存、彼此不重叠
        # TODO task kv_pool_init: set up this KV pool: keep the five size arguments as attributes of the same names (the rest of the class, the engine and later chapters read them); allocate the whole pool at once (element type and device as the arguments say, not filled with zeros: the class docstring says why), and prepare the per-layer lists of K views self._k_views and V views self._v_views (k_cache and v_cache take from them). The layout is your design, the contract is in the class docstring: each view [all slots, KV heads, head size], contiguous in memory, sharing memory with the pool, none overlapping another
        raise TaskNotDone("kvcache", "kv_pool_init")

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def dtype(self) -> torch.dtype:
        return self._k_views[0].dtype

    @property
    def device(self) -> torch.device:
        return self._k_views[0].device

    def k_cache(self, layer_id: int) -> torch.Tensor:
        """第 ``layer_id`` 层的 K，按槽位摊平成 ``[num_pages * page_size, KV 头数, head_dim]`` 的视图。

        en: The K of layer ``layer_id``, as a view flattened by slot: ``[num_pages * page_size, KV heads, head_dim]``.
        """
        return self._k_views[layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._v_views[layer_id]

    def zero_(self) -> None:
        """把整个池子清零：各层的 K、V 视图合起来正好是整个池子（CUDA 上引擎启动时用，见 ``Engine``）。

        en: Zero the whole pool: the layers' K and V views together are exactly the whole pool (the engine uses it at
        start on CUDA, see ``Engine``).
        """
        for views in (self._k_views, self._v_views):
            for view in views:
                view.zero_()

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
        """把本轮算出的 K/V（``[T, KV 头数, head_dim]``）写进第 ``layer_id`` 层的 ``out_loc`` 槽位，别处一个也不碰。

        en: Write this step's K/V (``[T, KV heads, head_dim]``) into the ``out_loc`` slots of layer ``layer_id``,
        touching nothing else.
        """
        # TODO 任务 store_kv：把 k、v 原地写进第 layer_id 层里 out_loc 指定的槽位，别的槽位、别的层一个也不动；out_loc 是 int32。给定：这个类按层给出的 K、V 视图
        # TODO task store_kv: write k and v in place into the slots out_loc names in layer layer_id, leaving every other slot and every other layer untouched; out_loc is int32. Given: this class's per-layer K and V views
        raise TaskNotDone("kvcache", "store_kv")

    @staticmethod
    def bytes_per_page(
        num_kv_heads: int, num_layers: int, head_dim: int, page_size: int, dtype: torch.dtype
    ) -> int:
        """一页在所有层里占多少字节（K 与 V 都算）；引擎用它从空闲内存推出能放几页。

        en: Bytes one page takes across all layers (K and V); the engine uses it to work out how many pages fit in free
        memory.
        """
        # TODO 任务 bytes_per_page：返回一页在所有层里、K 和 V 合起来占的字节数：页数乘它正好等于整个 KV 池的大小，fp32 和 bf16 都一样成立
        # TODO task bytes_per_page: return the bytes one page takes across all layers, K and V together: times the number of pages it equals the size of the whole KV pool, for fp32 and bf16 alike
        raise TaskNotDone("kvcache", "bytes_per_page")


def pages_to_slots(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """页号 → 这些页里的全部 token 槽位，按顺序：页 ``p`` 的槽位是 ``p*page_size .. p*page_size+page_size-1``。

    例：``pages=[3, 1]``、``page_size=2`` → ``[6, 7, 2, 3]``。把结果的前 n 个写进页表的一行，
    就给一个 n 个 token 的请求安排好了位置。

    en: Page numbers -> every token slot of those pages, in order: page ``p`` holds slots ``p*page_size ..
    p*page_size+page_size-1``.

    Example: ``pages=[3, 1]``, ``page_size=2`` -> ``[6, 7, 2, 3]``. Writing the first n of the result into a row of the
    page table gives an n-token request its places.
    """
    # TODO 任务 pages_to_slots：返回这些页里的全部 token 槽位，1 维，按页的顺序、每页之内从小到大（例子见函数文档）；与输入的页号同 dtype、同设备
    # TODO task pages_to_slots: return every token slot of the given page numbers as a 1-D tensor, page after page and in increasing order within each page (example in the docstring); same dtype and device as the input
    raise TaskNotDone("kvcache", "pages_to_slots")


def create_page_table(max_running_req: int, max_seq_len: int, device: torch.device | str) -> torch.Tensor:
    """页表：每个请求槽位一行，另加一行留给填充用的假请求。初值 0 是合法槽位，读到也不会越界。

    token 池与它同形同类型（``torch.zeros_like(page_table)``），只是存的是 token id。

    en: The page table: one row per request slot, plus one row for the dummy request used as padding. The initial 0 is a
    valid slot, so reading it never goes out of range.

    The token pool has the same shape and dtype (``torch.zeros_like(page_table)``), but holds token ids.
    """
    return torch.zeros((max_running_req + 1, max_seq_len), dtype=torch.int32, device=device)

