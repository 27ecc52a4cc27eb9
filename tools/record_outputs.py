"""录制示例的输出，给文档引用（``[[output 名字]]`` 读 ``docs/outputs/<名字>.txt``）。

    python tools/record_outputs.py                 # 全部重新录制（机器忙时拒绝，见下）
    python tools/record_outputs.py stage2_milestone quickstart
    python tools/record_outputs.py --check         # 重跑并与已提交的输出比较确定性的行
    python tools/record_outputs.py --list
    python tools/record_outputs.py --lang en       # 英文版讲义用的输出（MINISGL_LANG=en），写到 docs/outputs/en/

示例一律用参考解答运行（``MINISGL_IMPL=solution``），与学员的进度无关。

**只在安静的机器上录制。** 录下的速度会写进讲义，别的进程抢 CPU 时测出的数字互相矛盾。所以录制前先看
1 分钟平均负载（``os.getloadavg()``，上限 ``--max-load``）和别的进程（任何一个占用超过 ``--busy-cpu``% 个核），
忙就说明原因、每 10 秒再看一次，最多等 ``--wait`` 秒，还忙就以退出码 3 结束；录制期间也一直看着别的进程，
有谁抢了 CPU，这一份就作废、等安静了重录。``--force`` 跳过这些（只在你要的是非计时的行时用）。
``--check`` 只比较遮住计时之后的行，不检查机器忙不忙。示例自己负责在计时前预热。

“确定性的行”怎么比：每一行先把与机器有关的数字遮住——带时间、速度、内存单位的数（``1.23 s``、
``409 ms``、``104.5 tok/s``、``2.4 GB``）和倍数（``1.7×``、``5 倍``；``请求3×5`` 这种后面紧跟数字的不算倍数）——
遮住后整行必须与已提交的一致；所以 token 数、分块、页数、生成的 token 这类数字都要逐字相等。个别示例还可以用
``volatile`` 正则整行跳过（例如打印设备名、线程数的行）。

英文版（``--lang en``）是同一批示例在 ``MINISGL_LANG=en`` 下的输出。CI 不再重跑一遍英文：
:func:`same_numbers` 要求英文录制里确定性的数字与中文录制的逐个相同（中文录制由 ``--check`` 重跑核对）。
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from minisgl.paths import REPO_ROOT as REPO

OUTPUTS = REPO / "docs" / "outputs"
LANG_DIRS = {"zh": OUTPUTS, "en": OUTPUTS / "en"}  # 每种语言的录制放在哪里


@dataclass(frozen=True)
class Example:
    script: str  # 相对仓库根目录
    args: tuple[str, ...] = ()
    volatile: tuple[str, ...] = ()  # 整行跳过的正则（与机器有关、又不是带单位的数字）
    timeout: int = 900


#: 文档引用的全部示例。名字就是 docs/outputs/<名字>.txt。
EXAMPLES: dict[str, Example] = {
    "step0": Example("examples/step0_tiny_engine.py"),
    "stage1_milestone": Example("examples/stage1_milestone.py", timeout=1800),
    "stage2_milestone": Example("examples/stage2_milestone.py", timeout=1800),
    # 里程碑页的练习：只有 2 个请求槽时，实验 2 逐步打印
    "stage2_milestone_trace": Example(
        "examples/stage2_milestone.py", ("--max-running-req", "2", "--trace", "--experiment", "2"), timeout=1800
    ),
    "quickstart": Example("examples/quickstart.py"),
    # 进程号、命令行每次都不同；最大的解码批看线程怎么被调度：这些行整行跳过
    # en: pids and command lines differ every run, the largest decode batch depends on how the threads get scheduled:
    # en: skip those lines
    "stage3_milestone": Example("examples/stage3_milestone.py",
                                volatile=(r"^\s+pid\s+\d+", r"^\s+(流式输出时|while streaming)", r"^\s+(最大的解码批|largest decode batch)"),
                                timeout=1800),
    "stage4_milestone": Example("examples/stage4_milestone.py"),
    "stage5_milestone": Example("examples/stage5_milestone.py"),
    # 各章的小示例（examples/chapters/），每章页面的“运行结果”来自这里
    "core": Example("examples/chapters/core.py"),
    "layers": Example("examples/chapters/layers.py"),
    "models": Example("examples/chapters/models.py"),
    "kvcache": Example("examples/chapters/kvcache.py"),
    "attention": Example("examples/chapters/attention.py"),
    "engine": Example("examples/chapters/engine.py"),
    "scheduler": Example("examples/chapters/scheduler.py"),
    "cache_manager": Example("examples/chapters/cache_manager.py"),
    "radix_cache": Example("examples/chapters/radix_cache.py"),
    "chunked_prefill": Example("examples/chapters/chunked_prefill.py"),
    "overlap": Example("examples/chapters/overlap.py"),
    "message": Example("examples/chapters/message.py"),
    "tokenizer": Example("examples/chapters/tokenizer.py"),
    "scheduler_io": Example("examples/chapters/scheduler_io.py"),
    "api_server": Example("examples/chapters/api_server.py"),
    "sampling": Example("examples/chapters/sampling.py"),
    "grammar": Example("examples/chapters/grammar.py"),
    "distributed": Example("examples/chapters/distributed.py"),
    "tensor_parallel": Example("examples/chapters/tensor_parallel.py"),
    "tp_scheduler": Example("examples/chapters/tp_scheduler.py"),
    "moe": Example("examples/chapters/moe.py"),
    "expert_parallel": Example("examples/chapters/expert_parallel.py"),
    "router": Example("examples/chapters/router.py"),
    "ngram_cache": Example("examples/chapters/ngram_cache.py"),
    "spec_tree": Example("examples/chapters/spec_tree.py"),
    "speculative": Example("examples/chapters/speculative.py"),
    "quantization": Example("examples/chapters/quantization.py"),
}

_UNIT = r"(?:ms|s|秒|毫秒|tok/s|token/s|tokens/s|it/s|GB/s|MB/s|GB|GiB|MB|MiB|KB|KiB|%)"
_MEASURED = re.compile(rf"\d+(?:\.\d+)?(?:e[-+]?\d+)?\s*{_UNIT}(?![A-Za-z])")
_RATIO = re.compile(r"\d+(?:\.\d+)?\s*(?:×|倍|x\b)(?!\s*\d)")  # “请求3×5”不是倍数


def mask(line: str) -> str:
    """遮住与机器有关的数字，只留下应当逐字相等的部分。"""
    return _RATIO.sub("<倍数>", _MEASURED.sub("<测量值>", line.rstrip()))


def deterministic_lines(text: str, ex: Example) -> list[str]:
    pats = [re.compile(p) for p in ex.volatile]
    return [mask(l) for l in text.splitlines() if not any(p.search(l) for p in pats)]


_NUMBER = re.compile(r"\d+")


def same_numbers(zh_text: str, en_text: str, ex: Example) -> bool:
    """两种语言的录制是否是同一批结果：遮住计时之后逐行比较，每行的整数（语序不同，按大小排好）必须一样。"""
    def numbers(text: str) -> list[list[int]]:
        return [sorted(map(int, _NUMBER.findall(line))) for line in deterministic_lines(text, ex)]

    return numbers(zh_text) == numbers(en_text)


def command_line(ex: Example) -> str:
    return " ".join(["python", ex.script, *ex.args])


# ---------------------------------------------------------------- 机器忙不忙


@dataclass
class Quiet:
    """录制计时之前机器要多安静。"""

    max_load: float  # 1 分钟平均负载的上限
    busy_cpu: float  # 别的进程占用超过一个核的这么多百分比，就算忙
    wait: float  # 最多等多少秒


def default_max_load() -> float:
    """2 核机器上 0.5，4 核及以上 1.0：PyTorch 会用满所有核，哪怕一个核被占着，计时也不可信。"""
    return min(1.0, 0.25 * (os.cpu_count() or 1))


def _cpu_ticks() -> dict[int, tuple[int, int, str]]:
    """每个进程的 (累计 CPU 时间, 父进程, 名字)。Linux 读 /proc；别的系统有 psutil 就用它，都没有就返回空。"""
    procs: dict[int, tuple[int, int, str]] = {}
    proc = Path("/proc")
    if (proc / "self" / "stat").is_file():
        for d in proc.iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:  # 进程刚好结束了
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            procs[int(d.name)] = (int(fields[11]) + int(fields[12]), int(fields[1]), comm)  # utime + stime, ppid
        return procs
    try:
        import psutil
    except ImportError:
        return procs
    for pr in psutil.process_iter(["ppid", "name", "cpu_times"]):
        times = pr.info["cpu_times"]
        if times is not None:
            procs[pr.pid] = (int(100 * (times.user + times.system)), pr.info["ppid"] or 0, pr.info["name"] or "?")
    return procs


def _ticks_per_second() -> int:
    try:
        return os.sysconf("SC_CLK_TCK") if Path("/proc/self/stat").is_file() else 100
    except (AttributeError, ValueError, OSError):
        return 100


def _ours(procs: dict[int, tuple[int, int, str]]) -> set[int]:
    """本进程和它的全部子孙（正在录制的示例）。"""
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, (_, ppid, _) in procs.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    return mine


class CpuWatch:
    """隔一段时间采样一次，找出占用 CPU 的别的进程（不算本进程和它的子孙）。"""

    def __init__(self) -> None:
        self.hz = _ticks_per_second()
        self.last = _cpu_ticks()
        self.at = time.monotonic()
        self.available = bool(self.last)

    def sample(self) -> list[tuple[int, str, float]]:
        """上次采样以来每个别的进程用了一个核的百分之几：[(pid, 名字, 百分比)]，从高到低。"""
        now, at = _cpu_ticks(), time.monotonic()
        elapsed = max(at - self.at, 1e-3)
        mine = _ours(now)
        usage = []
        for pid, (ticks, _, comm) in now.items():
            if pid in mine or pid not in self.last:
                continue
            percent = 100 * (ticks - self.last[pid][0]) / self.hz / elapsed
            usage.append((pid, comm, percent))
        self.last, self.at = now, at
        return sorted(usage, key=lambda u: -u[2])


def busy_reasons(quiet: Quiet, *, check_load: bool) -> list[str]:
    """机器为什么不够安静（空列表：安静）。``check_load``：也看平均负载（录制中途不看：负载里有我们自己）。"""
    reasons = []
    if check_load and hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
        if load > quiet.max_load:
            reasons.append(f"1 分钟平均负载 {load:.2f}，超过上限 {quiet.max_load:.2f}（{os.cpu_count()} 个核）")
    watch = CpuWatch()
    time.sleep(1.0)
    for pid, comm, percent in watch.sample():
        if percent > quiet.busy_cpu:
            reasons.append(f"进程 {pid}（{comm}）占用 {percent:.0f}% 个核")
    return reasons


class MachineBusy(Exception):
    """等够了，机器还是忙。"""


def wait_until_quiet(quiet: Quiet, *, check_load: bool) -> None:
    """安静就立刻返回；忙就说明原因，每 10 秒再看一次，最多等 ``quiet.wait`` 秒，还忙就抛 :class:`MachineBusy`。"""
    deadline = time.monotonic() + quiet.wait
    reasons = busy_reasons(quiet, check_load=check_load)
    said = False
    while reasons:
        if time.monotonic() >= deadline:
            raise MachineBusy("；".join(reasons))
        if not said:
            print(f"[等待] 机器正忙，录下的计时会不可信：{'；'.join(reasons)}。最多再等 {quiet.wait:.0f} 秒……", flush=True)
            said = True
        time.sleep(10)
        reasons = busy_reasons(quiet, check_load=check_load)
    if said:
        print("[等待] 机器安静了，开始录制", flush=True)


# ---------------------------------------------------------------- 运行示例


def run(name: str, ex: Example, quiet: Quiet | None = None, language: str = "zh") -> tuple[str, list[str]]:
    """运行一个示例（参考解答，``language`` 语言），返回要写进文件的文本（第一行是命令，后面是标准输出），
    以及运行期间抢 CPU 的别的进程（``quiet`` 为 None 时不看，返回空列表）。"""
    env = {**os.environ, "MINISGL_IMPL": "solution", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
           "MINISGL_LANG": language}
    env.pop("MINISGL_WORKSPACE", None)
    env.pop("MINISGL_SOLUTIONS", None)
    proc = subprocess.Popen(
        [sys.executable, ex.script, *ex.args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watch = CpuWatch() if quiet is not None else None
    intruders: dict[int, str] = {}
    deadline = time.monotonic() + ex.timeout
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=2)  # 超时后再调用不会丢输出
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                proc.kill()
                proc.communicate()
                raise
            if watch is not None:
                for pid, comm, percent in watch.sample():
                    if percent > quiet.busy_cpu:
                        intruders[pid] = f"进程 {pid}（{comm}）占用 {percent:.0f}% 个核"
    if proc.returncode != 0:
        tail = "\n".join((stdout + stderr).splitlines()[-30:])
        raise RuntimeError(f"{ex.script} 退出码 {proc.returncode}：\n{tail}")
    # 仓库在哪台机器、哪个目录都一样：绝对路径换成相对仓库根目录的路径
    body = "\n".join(l.rstrip() for l in stdout.replace(str(REPO) + os.sep, "").rstrip().splitlines())
    return f"$ {command_line(ex)}\n{body}\n", list(intruders.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="录制示例输出到 docs/outputs/，或检查它们是否仍然成立")
    parser.add_argument("names", nargs="*", help="只处理这些示例（默认全部）")
    parser.add_argument("--check", action="store_true", help="重跑并比较确定性的行，不写文件；不一致时退出码 1")
    parser.add_argument("--list", action="store_true", help="列出示例和它们的状态")
    parser.add_argument("--force", action="store_true", help="机器忙也照样录制（录下的计时不可信，只在要非计时的行时用）")
    parser.add_argument("--max-load", type=float, default=default_max_load(), help="1 分钟平均负载的上限（默认按核数）")
    parser.add_argument("--busy-cpu", type=float, default=50.0, help="别的进程占用超过一个核的百分之几算忙（默认 50）")
    parser.add_argument("--wait", type=float, default=600.0, help="机器忙时最多等多少秒（默认 600）")
    parser.add_argument("--lang", choices=tuple(LANG_DIRS), default="zh", help="用哪种语言运行、录到哪里（默认 zh）")
    args = parser.parse_args(argv)
    outputs = LANG_DIRS[args.lang]

    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        print(f"不认识的示例：{', '.join(unknown)}；已知：{', '.join(EXAMPLES)}", file=sys.stderr)
        return 2
    names = args.names or list(EXAMPLES)

    if args.list:
        for name in names:
            ex = EXAMPLES[name]
            state = "已录制" if (outputs / f"{name}.txt").is_file() else "未录制"
            exists = "" if (REPO / ex.script).is_file() else "（脚本还不存在）"
            print(f"{name:22} {command_line(ex)[len('python '):]}{exists}  {state}")
        return 0

    quiet = None if args.check or args.force else Quiet(args.max_load, args.busy_cpu, args.wait)
    if args.force and not args.check:
        print("[注意] --force：不检查机器忙不忙，录下的计时可能不可信", flush=True)
    if quiet is not None:
        if not CpuWatch().available:
            print("[注意] 这个系统上读不到别的进程的 CPU 占用（没有 /proc，也没装 psutil），只看平均负载", flush=True)
        try:
            wait_until_quiet(quiet, check_load=True)
        except MachineBusy as busy:
            print(f"[拒绝录制] 等了 {quiet.wait:.0f} 秒机器还是忙：{busy}。\n"
                  "请等别的任务结束再录（或用 --wait 等更久）；只要非计时的行时可以加 --force。", file=sys.stderr)
            return 3

    outputs.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    missing: list[str] = []
    for name in names:
        ex = EXAMPLES[name]
        out_file = outputs / f"{name}.txt"
        if not (REPO / ex.script).is_file():
            print(f"[缺少] {name}：{ex.script} 还不存在，没有录制", flush=True)
            missing.append(name)
            continue
        t0 = time.perf_counter()
        try:
            for attempt in range(3):
                if quiet is not None and attempt:  # 上一次录制期间有别的进程抢 CPU：等安静了重录
                    wait_until_quiet(quiet, check_load=False)
                text, intruders = run(name, ex, quiet, args.lang)
                if not intruders:
                    break
                print(f"[作废] {name}：录制期间有别的进程抢 CPU（{'；'.join(intruders)}），计时不可信", flush=True)
            else:
                raise MachineBusy("连续 3 次录制期间都有别的进程抢 CPU")
        except subprocess.TimeoutExpired:
            print(f"[超时] {name}：{ex.script} 超过 {ex.timeout} 秒还没结束", flush=True)
            failed.append(name)
            continue
        except RuntimeError as err:
            print(f"[失败] {name}：{err}", flush=True)
            failed.append(name)
            continue
        except MachineBusy as busy:
            print(f"[拒绝录制] {name}：机器一直忙（{busy}），没有写文件；请等安静了再录。", file=sys.stderr, flush=True)
            return 3
        took = f"{time.perf_counter() - t0:.1f} s"
        if not args.check:
            out_file.write_text(text, encoding="utf-8")
            print(f"[已录制] {name} → {out_file.relative_to(REPO)}（{took}）", flush=True)
            continue
        if not out_file.is_file():
            print(f"[未录制] {name}：没有 {out_file.relative_to(REPO)}，请运行 python tools/record_outputs.py {name} --lang {args.lang}")
            failed.append(name)
            continue
        old = deterministic_lines(out_file.read_text(encoding="utf-8"), ex)
        new = deterministic_lines(text, ex)
        if old == new:
            print(f"[一致] {name}（{took}）", flush=True)
            continue
        failed.append(name)
        print(f"[不一致] {name}：确定性的行与已提交的 {out_file.relative_to(REPO)} 不同（与机器有关的数字已遮住）：")
        diff = difflib.unified_diff(old, new, "已提交", "本次运行", lineterm="", n=1)
        print("\n".join(diff), flush=True)
        print(f"如果改动是有意的，运行 python tools/record_outputs.py {name} --lang {args.lang} 重新录制并提交"
              "（两种语言都要重录）。", flush=True)

    if missing:
        print(f"还没有脚本的示例：{', '.join(missing)}")
    if failed:
        print(f"{'检查' if args.check else '录制'}失败：{', '.join(failed)}")
    return 1 if failed or (args.check and missing) else 0


if __name__ == "__main__":
    sys.exit(main())
