"""讲义里的示意图（docs/assets/diagrams/*.svg）由这个脚本生成：python tools/make_diagrams.py"""
import html
import os

from minisgl.i18n import tr
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
    b += brace(x0, x0 + 4 * cw - 6, y + 56, tr("K/V cached"))
    b += brace(x0 + 4 * cw, x0 + 7 * cw - 6, y + 56, tr("extend_len = 3 (this round)"))
    b += brace(x0 + 7 * cw, x0 + 10 * cw - 6, y + 56, "remain_len = 3")
    for pos, name in ((4, "cached_len"), (7, "device_len"), (10, "max_device_len")):
        b += text(x0 + pos * cw - 2, y + 108, name, color=C["muted"])
    return svg(560, 180, b)

# 2. kvcache: page table -> slots -> pool
def kvcache():
    b = DEFS
    b += text(20, 28, tr("Page table (a row per request, token-level slots)"), anchor="start", weight="bold")
    rows = [(tr("request A"), [6, 7, 2, 3, 12]), (tr("request B"), [0, 1, 10])]
    for r, (name, slots) in enumerate(rows):
        y = 44 + r * 40
        b += text(60, y + 21, name)
        for j, s in enumerate(slots):
            b += rect(100 + j * 40, y, 36, 28, C["extend"] if r == 0 else C["orange"])
            b += text(118 + j * 40, y + 19, str(s))
    b += text(20, 160, tr("KV pool (page_size = 2: 2 slots per page, slot = page × 2 + offset)"), anchor="start", weight="bold")
    owner = {6: 0, 7: 0, 2: 0, 3: 0, 12: 0, 0: 1, 1: 1, 10: 1}
    tail = {13: 0, 11: 1}  # 各自最后一页里还没用到的槽位：归这个请求，暂时空着（页内碎片）
    for p in range(8):
        x = 20 + p * 72
        b += text(x + 34, 182, tr("page {p}", p=p), color=C["muted"])
        for o in range(2):
            s = p * 2 + o
            who = owner.get(s, tail.get(s))
            fill = C["extend"] if who == 0 else C["orange"] if who == 1 else C["future"]
            b += rect(x + o * 34, 190, 32, 30, fill, dash=s in tail)
            if s in tail:  # 冲淡颜色：属于这个请求，但没有存 K/V
                b += f'<rect x="{x + o * 34}" y="190" width="32" height="30" rx="3" fill="#fff" fill-opacity="0.6"/>'
            b += text(x + o * 34 + 16, 210, str(s), size=12, color=C["muted"] if s in tail else None)
    b += line(118, 72, 20 + 3 * 72 + 16, 188, arrow=True, color=C["muted"])
    b += text(400, 70, tr("A's token 0 is in slot 6 (page 3)"), anchor="start", color=C["muted"])
    b += text(340, 104, tr("Dashed cells (slots 13, 11) are in the last pages of A and B:"), anchor="start", color=C["muted"])
    b += text(340, 122, tr("owned by that request but empty (internal fragmentation)"), anchor="start", color=C["muted"])
    b += text(340, 140, tr("White pages (2, 4, 7) are free and can go to other requests"), anchor="start", color=C["muted"])
    return svg(720, 240, b)

# 3. attention: varlen batch
def attention():
    b = DEFS
    b += text(20, 26, tr("Concatenated query (6 tokens this round)"), anchor="start", weight="bold")
    toks = [("A0", 0), ("A1", 0), ("A2", 0), ("A3", 0), ("B3", 1), ("B4", 1)]
    for i, (t, r) in enumerate(toks):
        b += rect(20 + i * 46, 38, 42, 28, C["extend"] if r == 0 else C["orange"])
        b += text(41 + i * 46, 57, t)
    b += text(20, 92, tr("cu_seqlens_q = [0, 4, 6]; last tokens at [3, 5]"), anchor="start", color=C["muted"])
    # masks
    def mask(x0, y0, title, cached, seq, fill):
        s = text(x0, y0 - 10, title, anchor="start", weight="bold")
        for i in range(seq - cached):
            for j in range(seq):
                vis = j <= cached + i
                s += rect(x0 + j * 22, y0 + i * 22, 20, 20, fill if vis else C["future"], rx=2)
        s += text(x0 + seq * 11, y0 + (seq - cached) * 22 + 16, f"key 0..{seq - 1}", color=C["muted"], size=12)
        return s
    b += mask(20, 130, tr("A: cached_len=0, seq_len=4"), 0, 4, C["extend"])
    b += mask(220, 130, tr("B: cached_len=3, seq_len=5"), 3, 5, C["orange"])
    b += text(220, 210, tr("B's two queries sit at positions 3, 4:"), anchor="start", color=C["muted"], size=12)
    b += text(220, 226, tr("the first 3 keys are long cached and still visible"), anchor="start", color=C["muted"], size=12)
    # SDPA 后端：同一批补齐成矩形（B=2，max_q=4，max_k=5）
    y = 270
    b += line(20, y - 14, 540, y - 14, dash=True, color=C["muted"])
    b += text(20, y + 6, tr("SDPA backend: padded to [B=2, max_q=4] queries, [B, max_k=5] keys"), anchor="start", weight="bold")
    y += 24
    b += text(20, y + 12, tr("q_index [B, max_q]: index into the concatenated tokens (gray: padding = the row's last)"), anchor="start", size=12)
    qi = [[0, 1, 2, 3], [4, 5, 5, 5]]
    for r, row in enumerate(qi):
        b += text(34, y + 40 + r * 26, "AB"[r], color=C["muted"])
        for i, t in enumerate(row):
            real = i < (4, 2)[r]
            b += rect(48 + i * 34, y + 25 + r * 26, 30, 22, (C["extend"], C["orange"])[r] if real else C["gray"], dash=not real)
            b += text(63 + i * 34, y + 40 + r * 26, str(t))
            b += text(75 + i * 34, y + 32 + r * 26, str(r * 4 + i), size=8, color=C["muted"])
    b += text(200, y + 40, tr("flattened positions (small) 0..7;"), anchor="start", size=12, color=C["muted"])
    b += text(200, y + 58, tr("out_index [T] = [0, 1, 2, 3, 4, 5]: picks back the 6 real queries"), anchor="start", size=12)
    b += text(48, y + 96, tr("if B came before A: q_index = [[0, 1, 1, 1], [2, 3, 4, 5]], out_index = [0, 1, 4, 5, 6, 7]"), anchor="start", size=12, color=C["muted"])
    y += 114
    b += text(20, y + 12, tr("kv_slots [B, max_k] = page_table[[A's table_idx, B's table_idx], :5] (already on the device)"), anchor="start", size=12)
    for r, n in enumerate((4, 5)):
        b += text(34, y + 40 + r * 26, "AB"[r], color=C["muted"])
        for j in range(5):
            b += rect(48 + j * 34, y + 25 + r * 26, 30, 22, (C["cached"] if (r == 1 and j < 3) else (C["extend"], C["orange"])[r]) if j < n else C["gray"], dash=j >= n)
            b += text(63 + j * 34, y + 40 + r * 26, f"s{j}" if j < n else "·", size=11)
    b += text(230, y + 40, tr("each row is the first max_k slots of the request's page-table row;"), anchor="start", size=12, color=C["muted"])
    b += text(230, y + 58, tr("past seq_len (gray): any valid slot, masked out"), anchor="start", size=12, color=C["muted"])
    y += 96
    b += text(20, y + 12, tr("mask [B, max_q, max_k] (a head dim is added before SDPA → [B, 1, max_q, max_k])"), anchor="start", size=12)
    for r, (cached, seq, ext) in enumerate(((0, 4, 4), (3, 5, 2))):
        x0 = 48 + r * 250
        b += text(x0, y + 34, tr("{value}: cached_len={cached}, seq_len={seq}", value='AB'[r], cached=cached, seq=seq), anchor="start", size=12, color=C["muted"])
        for i in range(4):
            for j in range(5):
                vis = j <= cached + i and j < seq
                fill = (C["extend"], C["orange"])[r] if i < ext else C["gray"]
                b += rect(x0 + j * 22, y + 42 + i * 22, 20, 20, fill if vis else C["future"], rx=2)
    b += text(20, y + 148, tr("B's rows 2, 3 (gray) are padding: positions cached_len + i = 5, 6, past seq_len,"), anchor="start", size=12, color=C["muted"])
    b += text(20, y + 166, tr("so no row is fully masked (that gives NaN in a hand-written softmax)"), anchor="start", size=12, color=C["muted"])
    return svg(560, y + 180, b)

# 5. radix tree of the milestone
def radix():
    b = DEFS
    b += rect(30, 20, 120, 34, C["gray"], rx=17) + text(90, 42, tr("root"))
    b += line(90, 54, 90, 80, arrow=True)
    b += rect(20, 82, 330, 40, C["cached"]) + text(185, 100, tr("system prompt (without the trailing space)"), weight="bold") + text(185, 116, tr("52 tokens: shared by 4 requests"), size=12)
    kids = [(tr("ĠWhat Ġis (2)"), 30, C["purple"]), (tr("ĠName Ġa Ġprimary … (5)"), 250, C["orange"]), (tr("ĠSpell Ġcat . (3)"), 470, C["orange"])]
    for label, x, fill in kids:
        b += line(185, 122, x + 90, 160, arrow=True)
        b += rect(x, 162, 180, 34, fill) + text(x + 90, 184, label, size=12)
    b += line(120, 196, 60, 232, arrow=True) + line(120, 196, 200, 232, arrow=True)
    b += rect(0 + 10, 234, 120, 34, C["extend"]) + text(70, 256, tr("Ġ 2 Ġ+ Ġ 2 ? (6)"), size=12)
    b += rect(140, 234, 170, 34, C["extend"]) + text(225, 256, tr("Ġthe Ġcapital … ? (5)"), size=12)
    b += text(20, 296, tr("Ġ marks \"preceded by a space\" in byte-level BPE: ĠWhat is \" What\", the space merged into the word's token"), anchor="start", size=12, color=C["muted"])
    b += text(20, 316, tr("request 1 = 52 + 2 + 6 = 60; request 3 = 52 + 2 + 5 = 59; request 2 = 52 + 5 = 57; request 4 = 52 + 3 = 55"), anchor="start", size=12, color=C["muted"])
    return svg(670, 332, b)

# 6. chunked prefill
def chunked():
    b = DEFS
    b += text(20, 26, tr("a 302-token prompt, max_extend_tokens = 96"), anchor="start", weight="bold")
    x = 20
    scale = 2.0
    for i, n in enumerate([96, 96, 96, 14]):
        w = n * scale
        fill = C["extend"] if i < 3 else C["cached"]
        b += rect(x, 40, w - 3, 34, fill)
        if w > 80:
            b += text(x + w / 2, 62, tr("step {value}: {n}", value=i + 1, n=n))
        else:
            b += text(x + w / 2, 62, str(n), size=12) + text(x + w + 6, 62, tr("← step {value}", value=i + 1), anchor="start")
        x += w
    b += text(20, 100, tr("the first 3 chunks are ChunkedReq: their sampled tokens are dropped (written to a scratch row)"), anchor="start", color=C["muted"])
    b += text(20, 120, tr("the last chunk is a plain Req: the whole prompt done, it samples the first output token"), anchor="start", color=C["muted"])
    return svg(720, 140, b)

# 7. overlap timeline
def overlap():
    b = DEFS
    def lane(y, name):
        return text(20, y + 20, name, anchor="start", weight="bold")
    b += text(20, 24, tr("plain main loop"), anchor="start", weight="bold", color=C["muted"])
    b += lane(36, tr("host")) + lane(76, tr("device"))
    x = 80
    for i in range(3):
        b += rect(x, 36, 50, 28, C["orange"]) + text(x + 25, 55, tr("prep {value}", value=i + 1), size=12)
        b += rect(x + 50, 76, 90, 28, C["extend"]) + text(x + 95, 95, tr("run step {value}", value=i + 1), size=12)
        b += rect(x + 140, 36, 40, 28, C["purple"]) + text(x + 160, 55, tr("post {value}", value=i + 1), size=11)
        x += 180
    b += text(20, 140, tr("overlap scheduling"), anchor="start", weight="bold", color=C["muted"])
    b += lane(152, tr("host")) + lane(192, tr("device"))
    x = 80
    b += rect(x, 152, 50, 28, C["orange"]) + text(x + 25, 171, tr("prep 1"), size=12)
    for i in range(4):
        dx = x + 50 + i * 95
        b += rect(dx, 192, 90, 28, C["extend"]) + text(dx + 45, 211, tr("run step {value}", value=i + 1), size=12)
        if i > 0:
            b += rect(dx, 152, 40, 28, C["purple"]) + text(dx + 20, 171, tr("post {i}", i=i), size=11)
        if i < 3:
            off = 40 if i > 0 else 0
            b += rect(dx + off, 152, 50, 28, C["orange"]) + text(dx + off + 25, 171, tr("prep {value}", value=i + 2), size=12)
    b += text(80, 248, tr("post = process the result. While the device runs step N, the host posts N−1 and preps N+1"), anchor="start", color=C["muted"])
    return svg(640, 264, b)

# 4. scheduler loop
def scheduler():
    b = DEFS
    steps = [(tr("receive new requests"), C["gray"]), (tr("schedule: prefill first"), C["orange"]), (tr("prepare: positions, out_loc, input mapping"), C["purple"]),
             (tr("forward + sample"), C["extend"]), (tr("process: outputs, finish, free"), C["cached"])]
    y = 20
    for i, (s, f) in enumerate(steps):
        b += rect(40, y, 330, 32, f) + text(205, y + 21, s)
        if i < len(steps) - 1:
            b += line(205, y + 32, 205, y + 44, arrow=True)
        y += 44
    b += f'<path d="M370,{y - 28} C430,{y - 28} 430,36 370,36" fill="none" stroke="{C["edge"]}" stroke-width="1.3" marker-end="url(#arr)"/>'
    b += text(440, 130, tr("until none left"), anchor="start", color=C["muted"])
    return svg(560, y + 10, b)

# 两种语言各画一遍：X.svg（中文）给中文页，X.en.svg 给英文页（mkdocs 的 i18n 插件按后缀自动替换）
for language, suffix in (("zh", ".svg"), ("en", ".en.svg")):
    os.environ["MINISGL_LANG"] = language
    for name, fn in dict(core=core, kvcache=kvcache, attention=attention, radix=radix, chunked=chunked, overlap=overlap, scheduler=scheduler).items():
        open(OUT + name + suffix, "w").write(fn())
    print(tr("wrote {OUT}", OUT=OUT + "*" + suffix))
