"""讲义里的示意图（docs/assets/diagrams/*.svg）由这个脚本生成：python tools/make_diagrams.py"""
import html

from minisgl.paths import REPO_ROOT

OUT = str(REPO_ROOT / "docs" / "assets" / "diagrams") + "/"
FONT = 'font-family="WenQuanYi Micro Hei, Noto Sans CJK SC, PingFang SC, Microsoft YaHei, sans-serif"'
C = dict(cached="#8fd19e", extend="#7fb3ff", future="#ffffff", edge="#555", text="#222", muted="#777",
         orange="#ffc48a", purple="#c9b3ff", gray="#e3e6eb", red="#ff9a9a")

def svg(w, h, body):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" {FONT} font-size="13">'
            f'<rect x="0" y="0" width="{w}" height="{h}" rx="8" fill="#f8f9fb"/>{body}</svg>\n')

def rect(x, y, w, h, fill, dash=False, rx=3):
    d = ' stroke-dasharray="4 3"' if dash else ''
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" fill="{fill}" stroke="{C["edge"]}"{d}/>'

def text(x, y, s, anchor="middle", size=13, color=None, weight=None):
    wt = f' font-weight="{weight}"' if weight else ''
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}" font-size="{size}" fill="{color or C["text"]}"{wt}>{html.escape(s)}</text>'

def line(x1, y1, x2, y2, arrow=False, dash=False, color=None):
    a = ' marker-end="url(#arr)"' if arrow else ''
    d = ' stroke-dasharray="4 3"' if dash else ''
    return f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color or C["edge"]}" stroke-width="1.3"{a}{d}/>'

DEFS = f'<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{C["edge"]}"/></marker></defs>'

def brace(x1, x2, y, label, color=None):
    return (line(x1, y, x2, y, color=color) + line(x1, y - 5, x1, y + 5, color=color) + line(x2, y - 5, x2, y + 5, color=color)
            + text((x1 + x2) / 2, y + 18, label, color=color))

# 1. core: the three lengths
def core():
    b = DEFS
    x0, y, cw = 30, 50, 44
    labels = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "", "", ""]
    for i in range(10):
        fill = C["cached"] if i < 4 else C["extend"] if i < 7 else C["future"]
        b += rect(x0 + i * cw, y, cw - 4, 34, fill, dash=i >= 7)
        b += text(x0 + i * cw + (cw - 4) / 2, y + 22, labels[i])
    b += text(x0, y - 14, "input_ids", anchor="start", color=C["muted"])
    for pos, name in ((0, "0"), (4, "cached_len = 4"), (7, "device_len = 7"), (10, "max_device_len = 10")):
        x = x0 + pos * cw - 2
        b += line(x, y - 4, x, y + 40, dash=True, color=C["muted"])
    b += brace(x0, x0 + 4 * cw - 6, y + 56, "K/V 已在缓存里")
    b += brace(x0 + 4 * cw, x0 + 7 * cw - 6, y + 56, "extend_len = 3（本轮要算）")
    b += brace(x0 + 7 * cw, x0 + 10 * cw - 6, y + 56, "remain_len = 3")
    for pos, name in ((4, "cached_len"), (7, "device_len"), (10, "max_device_len")):
        b += text(x0 + pos * cw - 2, y + 108, name, color=C["muted"])
    return svg(560, 180, b)

# 2. kvcache: page table -> slots -> pool
def kvcache():
    b = DEFS
    b += text(20, 28, "页表（每行一个请求，存 token 级槽位）", anchor="start", weight="bold")
    rows = [("请求 A", [6, 7, 2, 3, 12]), ("请求 B", [0, 1, 10])]
    for r, (name, slots) in enumerate(rows):
        y = 44 + r * 40
        b += text(60, y + 21, name)
        for j, s in enumerate(slots):
            b += rect(100 + j * 40, y, 36, 28, C["extend"] if r == 0 else C["orange"])
            b += text(118 + j * 40, y + 19, str(s))
    b += text(20, 160, "KV 池（page_size = 2：每页 2 个槽位，槽位 = 页号 × 2 + 页内偏移）", anchor="start", weight="bold")
    owner = {6: 0, 7: 0, 2: 0, 3: 0, 12: 0, 0: 1, 1: 1, 10: 1}
    tail = {13: 0, 11: 1}  # 各自最后一页里还没用到的槽位：归这个请求，暂时空着（页内碎片）
    for p in range(8):
        x = 20 + p * 72
        b += text(x + 34, 182, f"页 {p}", color=C["muted"])
        for o in range(2):
            s = p * 2 + o
            who = owner.get(s, tail.get(s))
            fill = C["extend"] if who == 0 else C["orange"] if who == 1 else C["future"]
            b += rect(x + o * 34, 190, 32, 30, fill, dash=s in tail)
            if s in tail:  # 冲淡颜色：属于这个请求，但没有存 K/V
                b += f'<rect x="{x + o * 34}" y="190" width="32" height="30" rx="3" fill="#fff" fill-opacity="0.6"/>'
            b += text(x + o * 34 + 16, 210, str(s), size=12, color=C["muted"] if s in tail else None)
    b += line(118, 72, 20 + 3 * 72 + 16, 188, arrow=True, color=C["muted"])
    b += text(400, 70, "A 的第 0 个 token 在槽位 6（页 3）", anchor="start", color=C["muted"])
    b += text(340, 104, "虚线格（槽位 13、11）在 A、B 各自的最后一页里：", anchor="start", color=C["muted"])
    b += text(340, 122, "归这个请求，暂时空着（页内碎片），别的请求用不了", anchor="start", color=C["muted"])
    b += text(340, 140, "白色的页（2、4、7）空闲，才能分给别的请求", anchor="start", color=C["muted"])
    return svg(720, 240, b)

# 3. attention: varlen batch
def attention():
    b = DEFS
    b += text(20, 26, "拼接后的 query（本轮 6 个 token）", anchor="start", weight="bold")
    toks = [("A0", 0), ("A1", 0), ("A2", 0), ("A3", 0), ("B3", 1), ("B4", 1)]
    for i, (t, r) in enumerate(toks):
        b += rect(20 + i * 46, 38, 42, 28, C["extend"] if r == 0 else C["orange"])
        b += text(41 + i * 46, 57, t)
    b += text(20, 92, "cu_seqlens_q = [0, 4, 6]；最后一个 token 在 [3, 5]", anchor="start", color=C["muted"])
    # masks
    def mask(x0, y0, title, cached, seq, fill):
        s = text(x0, y0 - 10, title, anchor="start", weight="bold")
        for i in range(seq - cached):
            for j in range(seq):
                vis = j <= cached + i
                s += rect(x0 + j * 22, y0 + i * 22, 20, 20, fill if vis else C["future"], rx=2)
        s += text(x0 + seq * 11, y0 + (seq - cached) * 22 + 16, f"key 0..{seq - 1}", color=C["muted"], size=12)
        return s
    b += mask(20, 130, "A：cached_len=0，seq_len=4", 0, 4, C["extend"])
    b += mask(220, 130, "B：cached_len=3，seq_len=5", 3, 5, C["orange"])
    b += text(220, 210, "B 的两个 query 位于位置 3、4：", anchor="start", color=C["muted"], size=12)
    b += text(220, 226, "前 3 个 key 早已在缓存里，照样看得见", anchor="start", color=C["muted"], size=12)
    # SDPA 后端：同一批补齐成矩形（B=2，max_q=4，max_k=5）
    y = 270
    b += line(20, y - 14, 540, y - 14, dash=True, color=C["muted"])
    b += text(20, y + 6, "SDPA 后端：补齐成 [B=2, max_q=4] 个 query、[B, max_k=5] 个 key", anchor="start", weight="bold")
    y += 24
    b += text(20, y + 12, "q_index [B, max_q]：每格取拼接张量里第几个 token（灰：补的，重复本请求最后一个）", anchor="start", size=12)
    qi = [[0, 1, 2, 3], [4, 5, 5, 5]]
    for r, row in enumerate(qi):
        b += text(34, y + 40 + r * 26, "AB"[r], color=C["muted"])
        for i, t in enumerate(row):
            real = i < (4, 2)[r]
            b += rect(48 + i * 34, y + 25 + r * 26, 30, 22, (C["extend"], C["orange"])[r] if real else C["gray"], dash=not real)
            b += text(63 + i * 34, y + 40 + r * 26, str(t))
            b += text(75 + i * 34, y + 32 + r * 26, str(r * 4 + i), size=8, color=C["muted"])
    b += text(200, y + 40, "摊平后的位置（小字）0..7；", anchor="start", size=12, color=C["muted"])
    b += text(200, y + 58, "out_index [T] = [0, 1, 2, 3, 4, 5]：挑回 6 个真实 query", anchor="start", size=12)
    b += text(48, y + 96, "若 B 排在 A 前：q_index = [[0, 1, 1, 1], [2, 3, 4, 5]]，out_index = [0, 1, 4, 5, 6, 7]", anchor="start", size=12, color=C["muted"])
    y += 114
    b += text(20, y + 12, "kv_slots [B, max_k] = page_table[[A 的 table_idx, B 的 table_idx], :5]（已在设备上）", anchor="start", size=12)
    for r, n in enumerate((4, 5)):
        b += text(34, y + 40 + r * 26, "AB"[r], color=C["muted"])
        for j in range(5):
            b += rect(48 + j * 34, y + 25 + r * 26, 30, 22, (C["cached"] if (r == 1 and j < 3) else (C["extend"], C["orange"])[r]) if j < n else C["gray"], dash=j >= n)
            b += text(63 + j * 34, y + 40 + r * 26, f"s{j}" if j < n else "·", size=11)
    b += text(230, y + 40, "每行是该请求页表行的前 max_k 个槽位；", anchor="start", size=12, color=C["muted"])
    b += text(230, y + 58, "超出 seq_len 的（灰）指向随便一个合法槽位，由 mask 屏蔽", anchor="start", size=12, color=C["muted"])
    y += 96
    b += text(20, y + 12, "mask [B, max_q, max_k]（传给 SDPA 前再加头维 → [B, 1, max_q, max_k]）", anchor="start", size=12)
    for r, (cached, seq, ext) in enumerate(((0, 4, 4), (3, 5, 2))):
        x0 = 48 + r * 250
        b += text(x0, y + 34, f"{'AB'[r]}：cached_len={cached}，seq_len={seq}", anchor="start", size=12, color=C["muted"])
        for i in range(4):
            for j in range(5):
                vis = j <= cached + i and j < seq
                fill = (C["extend"], C["orange"])[r] if i < ext else C["gray"]
                b += rect(x0 + j * 22, y + 42 + i * 22, 20, 20, fill if vis else C["future"], rx=2)
    b += text(20, y + 148, "B 的第 2、3 行（灰）是补的：位置照样记作 cached_len + i = 5、6，超出 seq_len，", anchor="start", size=12, color=C["muted"])
    b += text(20, y + 166, "所以整行可见、不会全被屏蔽（整行屏蔽时手写的 softmax 得 NaN）", anchor="start", size=12, color=C["muted"])
    return svg(560, y + 180, b)

# 5. radix tree of the milestone
def radix():
    b = DEFS
    b += rect(30, 20, 120, 34, C["gray"], rx=17) + text(90, 42, "根")
    b += line(90, 54, 90, 80, arrow=True)
    b += rect(20, 82, 330, 40, C["cached"]) + text(185, 100, "系统提示词（去掉末尾的空格）", weight="bold") + text(185, 116, "52 个 token：4 个请求共享", size=12)
    kids = [("ĠWhat Ġis（2 个）", 30, C["purple"]), ("ĠName Ġa Ġprimary … （5）", 250, C["orange"]), ("ĠSpell Ġcat .（3）", 470, C["orange"])]
    for label, x, fill in kids:
        b += line(185, 122, x + 90, 160, arrow=True)
        b += rect(x, 162, 180, 34, fill) + text(x + 90, 184, label, size=12)
    b += line(120, 196, 60, 232, arrow=True) + line(120, 196, 200, 232, arrow=True)
    b += rect(0 + 10, 234, 120, 34, C["extend"]) + text(70, 256, "Ġ 2 Ġ+ Ġ 2 ?（6）", size=12)
    b += rect(140, 234, 170, 34, C["extend"]) + text(225, 256, "Ġthe Ġcapital … ?（5）", size=12)
    b += text(20, 296, "Ġ 是字节级 BPE 里“前面带一个空格”的记号：ĠWhat 就是 “ What”，空格并进了这个词的 token", anchor="start", size=12, color=C["muted"])
    b += text(20, 316, "请求 1 = 52 + 2 + 6 = 60；请求 3 = 52 + 2 + 5 = 59；请求 2 = 52 + 5 = 57；请求 4 = 52 + 3 = 55", anchor="start", size=12, color=C["muted"])
    return svg(670, 332, b)

# 6. chunked prefill
def chunked():
    b = DEFS
    b += text(20, 26, "302 个 token 的提示词，max_extend_tokens = 96", anchor="start", weight="bold")
    x = 20
    scale = 2.0
    for i, n in enumerate([96, 96, 96, 14]):
        w = n * scale
        fill = C["extend"] if i < 3 else C["cached"]
        b += rect(x, 40, w - 3, 34, fill)
        if w > 80:
            b += text(x + w / 2, 62, f"第 {i + 1} 步：{n}")
        else:
            b += text(x + w / 2, 62, str(n), size=12) + text(x + w + 6, 62, f"← 第 {i + 1} 步", anchor="start")
        x += w
    b += text(20, 100, "前 3 块是 ChunkedReq：采样出的 token 丢掉（写到草稿行）", anchor="start", color=C["muted"])
    b += text(20, 120, "最后一块是普通 Req：算完整个提示词，采样出第 1 个输出 token", anchor="start", color=C["muted"])
    return svg(720, 140, b)

# 7. overlap timeline
def overlap():
    b = DEFS
    def lane(y, name):
        return text(20, y + 20, name, anchor="start", weight="bold")
    b += text(20, 24, "普通主循环", anchor="start", weight="bold", color=C["muted"])
    b += lane(36, "主机") + lane(76, "设备")
    x = 80
    for i in range(3):
        b += rect(x, 36, 50, 28, C["orange"]) + text(x + 25, 55, f"准备{i + 1}", size=12)
        b += rect(x + 50, 76, 90, 28, C["extend"]) + text(x + 95, 95, f"算第 {i + 1} 步", size=12)
        b += rect(x + 140, 36, 40, 28, C["purple"]) + text(x + 160, 55, f"处理{i + 1}", size=11)
        x += 180
    b += text(20, 140, "重叠调度", anchor="start", weight="bold", color=C["muted"])
    b += lane(152, "主机") + lane(192, "设备")
    x = 80
    b += rect(x, 152, 50, 28, C["orange"]) + text(x + 25, 171, "准备1", size=12)
    for i in range(4):
        dx = x + 50 + i * 95
        b += rect(dx, 192, 90, 28, C["extend"]) + text(dx + 45, 211, f"算第 {i + 1} 步", size=12)
        if i > 0:
            b += rect(dx, 152, 40, 28, C["purple"]) + text(dx + 20, 171, f"处理{i}", size=11)
        if i < 3:
            off = 40 if i > 0 else 0
            b += rect(dx + off, 152, 50, 28, C["orange"]) + text(dx + off + 25, 171, f"准备{i + 2}", size=12)
    b += text(80, 248, "设备算第 N 步时，主机先处理第 N−1 步的结果，再准备第 N+1 步；设备几乎不空等", anchor="start", color=C["muted"])
    return svg(640, 264, b)

# 4. scheduler loop
def scheduler():
    b = DEFS
    steps = [("接收新请求", C["gray"]), ("调度：预填充优先", C["orange"]), ("准备：positions、out_loc、输入映射", C["purple"]),
             ("前向 + 采样", C["extend"]), ("处理结果：记输出、判结束、还资源", C["cached"])]
    y = 20
    for i, (s, f) in enumerate(steps):
        b += rect(40, y, 330, 32, f) + text(205, y + 21, s)
        if i < len(steps) - 1:
            b += line(205, y + 32, 205, y + 44, arrow=True)
        y += 44
    b += f'<path d="M370,{y - 28} C430,{y - 28} 430,36 370,36" fill="none" stroke="{C["edge"]}" stroke-width="1.3" marker-end="url(#arr)"/>'
    b += text(440, 130, "直到没有请求", anchor="start", color=C["muted"])
    return svg(560, y + 10, b)

for name, fn in dict(core=core, kvcache=kvcache, attention=attention, radix=radix, chunked=chunked, overlap=overlap, scheduler=scheduler).items():
    open(OUT + name + ".svg", "w").write(fn())
print(f"已生成 {OUT}")
