# 手写 mini-sglang：三个入口命令。每个都会先做 setup（幂等，已完成时几秒内结束）。
PYTHON ?= $(shell command -v python || command -v python3)
PYTEST = $(PYTHON) -m pytest --timeout=900
# 课程机制和讲义的检查（checks/course、checks/docs）、骨架必须全红的那一轮，分给 JOBS 个进程一起跑，每个进程只用一个
# 计算线程（OpenMP 线程多于核时会互相等）；JOBS 按这台机器的核数定，最多 4。加载模型、起服务器、执行笔记本的检查
# 仍在一个进程里依次跑：它们本来就占满了核，有的还要看时机（浏览器里的流式输出），不适合和别的挤在一起。
# en: The checks of the course machinery and the book (checks/course, checks/docs) and the all-red skeleton run go to JOBS
# en: processes at once, each with one compute thread (more OpenMP threads than cores wait on each other); JOBS follows
# en: this machine's cores, at most 4. The checks that load models, start servers or execute notebooks still run one after
# en: another in one process: they already keep the cores busy, and some depend on timing (streaming in a browser).
# en: On 2 vCPUs (AMD EPYC): course + docs 7:35 -> 4:27, skeleton run 2:14 -> 1:41; notebooks on two workers 4:26 -> 4:04.
JOBS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")
PARALLEL = OMP_NUM_THREADS=1 $(PYTEST) -n $(JOBS) --dist loadfile
# CPU 线性层的三条路（内核、F.linear、oneDNN 打包）各指定一次，再跑一遍第 1、4 阶段建引擎的检查（标了 every_path 的）：
# 平时走哪条是这台机器量出来的，换一台机器就可能换一条，结果却不能跟着变。
# en: The three CPU linear paths (the kernel, F.linear, oneDNN's packed layout), each forced once, run the engine checks of
# en: stages 1 and 4 again (those marked every_path): normally the path is what this machine measured, another machine
# en: may take another one, and no result may change with it.
FORCED_PATHS = MINISGL_KERNEL_MAX_ROWS=512 MINISGL_KERNEL_MAX_ROWS=0 MINISGL_KERNEL_ONEDNN=1

.PHONY: setup test milestone milestone3 milestone4 milestone5 notebooks docs real-qwen3 gpu-check

setup:            ## 安装依赖并构建离线模型
	PYTHON=$(PYTHON) bash tools/setup.sh

# 英文版的里程碑笔记本不在这里执行：它和中文版跑的是同一份代码（里程碑的检查也跑了一遍），一个里程碑在 CI 里只跑两次；
# checks/notebooks 仍查它是工具生成的、输出里没有中文。
# en: The English milestone notebooks are not executed here: they run the same code as the Chinese ones (and the
# en: milestone checks run it once more), so a milestone runs twice in CI, not three times; checks/notebooks still checks
# en: that they are the tool's output and that their outputs hold no Chinese.
test: setup       ## 全部测试：骨架无漂移、参考解答全绿、每章骨架全红、笔记本逐格对照
	$(PYTHON) tools/make_skeletons.py --check
	$(PARALLEL) checks/course checks/docs --impl solution --strict
	$(PYTEST) checks --ignore=checks/course --ignore=checks/docs --impl solution --strict
	$(PARALLEL) checks/stage1 checks/stage2 checks/stage3 checks/stage4 checks/stage5 --impl skeleton --expect-red -q
	for forced in $(FORCED_PATHS); do echo "== $$forced"; env $$forced $(PYTEST) checks/stage1 checks/stage4 -m every_path --impl solution -q || exit 1; done
	MINISGL_IMPL=solution MINISGL_LANG=zh $(PYTEST) --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks --ignore=notebooks/en -q
	MINISGL_IMPL=solution MINISGL_LANG=en $(PYTEST) --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks/en -q --ignore-glob='notebooks/en/*/milestone.ipynb'

notebooks: setup  ## 重新生成并执行全部笔记本，中文版和 notebooks/en 下的英文版（改了解答或里程碑脚本之后）
	$(PYTHON) tools/build_notebooks.py

docs: setup       ## 本地预览课程讲义
	$(PYTHON) -m mkdocs serve

milestone: setup  ## 主任务：第二阶段里程碑
	$(PYTHON) examples/stage2_milestone.py

milestone3: setup ## 第三阶段里程碑：启动服务，用 openai 客户端对它说话
	$(PYTHON) examples/stage3_milestone.py

milestone4: setup ## 第四阶段里程碑：模型切给两个秩，离线和 --tp 2 的服务都与一个进程相同；--dp 2 的路由器让共享前缀只算一遍
	$(PYTHON) examples/stage4_milestone.py

milestone5: setup ## 第五阶段里程碑：SmolLM2 照着输入写，投机解码与不投机的 token 逐个相同，接受了多少、同一次运行里快了几倍
	$(PYTHON) examples/stage5_milestone.py

.PHONY: serve
serve: setup      ## 在线服务：python -m minisgl 用小模型 models/qwen3-tiny-random 监听 http://127.0.0.1:1919（对话页面在 /，Ctrl-C 退出）
	$(PYTHON) -m minisgl --model models/qwen3-tiny-random

real-qwen3: setup ## 可选：联网下载真正的 Qwen3-0.6B 到 models/Qwen3-0.6B
	$(PYTHON) tools/build_models.py --real-qwen3

gpu-check:        ## 在离线的 CUDA 机器上：CUDA 上的检查、CUDA 图开 / 关一致、里程碑，打印汇总表（不做 setup，不联网）
	$(PYTHON) tools/gpu_check.py --out gpu-check-out
