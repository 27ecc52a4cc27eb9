"""基准（不是测试）。``python bench/X.py`` 是各个命令；服务的负载生成器 ``bench/serve.py`` 只是命令行，它的库是这个包
里的模块，讲义的钩子和检查直接导入它们：

- :mod:`bench.workload`：发什么、什么时候发（请求集、泊松到达、负载形状）；
- :mod:`bench.accounting`：账怎么算（每个请求的记录、百分位、汇总与 goodput）；
- :mod:`bench.client`：怎么发（``openai`` 客户端的流式请求，开环与闭环，一次次运行）；
- :mod:`bench.peers`：对谁发（我们的服务器、``transformers serve``、llama.cpp 的进程，变体与消融）；
- :mod:`bench.report`：怎么报（比值、表、图，讲义里的表）；
- :mod:`bench.machine`：在什么机器上（机器的事实，等它安静、录制时盯着它）；
- :mod:`bench.common` 和 :mod:`bench.llamacpp`：各个基准共用的计时工具，llama.cpp 和它的 GGUF。

en: Benchmarks (not tests). ``python bench/X.py`` are the commands; the serving load generator ``bench/serve.py`` is
only a command line, its library is the modules of this package, which the book's hook and the checks import directly:

- :mod:`bench.workload`: what is sent and when (request sets, Poisson arrivals, load shapes);
- :mod:`bench.accounting`: how the books are kept (per-request records, percentiles, summaries and goodput);
- :mod:`bench.client`: how it is sent (the ``openai`` client's streamed requests, open and closed loops, the runs);
- :mod:`bench.peers`: to whom (our server, ``transformers serve``, llama.cpp's processes, variants and ablations);
- :mod:`bench.report`: how it is reported (ratios, tables, plots, the book's tables);
- :mod:`bench.machine`: on what machine (its facts, waiting until it is quiet, watching it while recording);
- :mod:`bench.common` and :mod:`bench.llamacpp`: the timing tools every bench shares, llama.cpp and its GGUF.
"""
