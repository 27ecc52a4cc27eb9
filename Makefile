# 手写 mini-sglang：三个入口命令。每个都会先做 setup（幂等，已完成时几秒内结束）。
PYTHON ?= $(shell command -v python || command -v python3)
PYTEST = $(PYTHON) -m pytest --timeout=900
# 默认在一个进程里跑。核多的机器可以并行：make test XDIST="-n 4 --dist loadfile"（一个文件、一本笔记本整个在同一个进程里）。
# en: One process by default. On a machine with more cores: make test XDIST="-n 4 --dist loadfile" (a whole file, a whole
# en: notebook stays on one worker). On 2 vCPUs it was not faster: the checks and notebooks already keep both cores busy.
XDIST ?=

.PHONY: setup test milestone milestone3 notebooks docs real-qwen3 gpu-check

setup:            ## 安装依赖并构建离线模型
	PYTHON=$(PYTHON) bash tools/setup.sh

test: setup       ## 全部测试：骨架无漂移、参考解答全绿、每章骨架全红、笔记本逐格对照
	$(PYTHON) tools/make_skeletons.py --check
	$(PYTEST) $(XDIST) checks --impl solution --strict
	$(PYTEST) $(XDIST) checks/stage1 checks/stage2 checks/stage3 --impl skeleton --expect-red -q
	MINISGL_IMPL=solution MINISGL_LANG=zh $(PYTEST) $(XDIST) --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks --ignore=notebooks/en -q
	MINISGL_IMPL=solution MINISGL_LANG=en $(PYTEST) $(XDIST) --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks/en -q

notebooks: setup  ## 重新生成并执行全部笔记本，中文版和 notebooks/en 下的英文版（改了解答或里程碑脚本之后）
	$(PYTHON) tools/build_notebooks.py

docs: setup       ## 本地预览课程讲义
	$(PYTHON) -m mkdocs serve

milestone: setup  ## 主任务：第二阶段里程碑
	$(PYTHON) examples/stage2_milestone.py

milestone3: setup ## 第三阶段里程碑：启动服务，用 openai 客户端对它说话
	$(PYTHON) examples/stage3_milestone.py

.PHONY: serve
serve: setup      ## 在线服务：python -m minisgl 用小模型 models/qwen3-tiny-random 监听 http://127.0.0.1:1919（对话页面在 /，Ctrl-C 退出）
	$(PYTHON) -m minisgl --model models/qwen3-tiny-random

real-qwen3: setup ## 可选：联网下载真正的 Qwen3-0.6B 到 models/Qwen3-0.6B
	$(PYTHON) tools/build_models.py --real-qwen3

gpu-check:        ## 在离线的 CUDA 机器上：CUDA 上的检查、CUDA 图开 / 关一致、里程碑，打印汇总表（不做 setup，不联网）
	$(PYTHON) tools/gpu_check.py --out gpu-check-out
