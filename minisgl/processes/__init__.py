"""进程：起一棵进程树、看着它、停掉它（``tree``），子进程随父进程死（``lifeline``），秩进程（``ranks``），按名字交给
子进程的函数（``by_name``），以及检查和基准测试起服务器用的 ``harness``。

en: Processes: start, watch and stop a process tree (``tree``), children that die with their parent (``lifeline``),
rank processes (``ranks``), functions handed to a child by name (``by_name``), and the ``harness`` that checks and
benchmarks use to start servers.
"""
