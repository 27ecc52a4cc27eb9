"""``python -m minisgl --model DIR ...``：启动 OpenAI 兼容的服务器（启动器见 ``minisgl.server.launch``，HTTP 接口是第 3.4 章的
``minisgl.api_server``）。

en: ``python -m minisgl --model DIR ...``: start the OpenAI-compatible server (the launcher is ``minisgl.server.launch``, the
HTTP API is chapter 3.4's ``minisgl.api_server``).
"""

if __name__ == "__main__":
    # spawn 出的工作进程不会重新执行这里，所以在守卫里导入：它们不必加载启动器
    # en: spawned workers do not run this again, so the import sits inside the guard: they need not load the launcher
    import sys

    from minisgl.i18n import tr
    from minisgl.processes.lifeline import die_with_parent
    from minisgl.server.args import offline_hub, preflight

    # 由别的进程起的（--dp 的副本、检查里的服务器）：随它而去 | en: started by another process (a --dp replica, a check's server): go down with it
    die_with_parent()
    # 先花几秒查模型目录和端口，再导入 torch、加载模型
    # en: first spend seconds checking the model folder and the port, then import torch and load the model
    if (problem := preflight(sys.argv[1:])) is not None:
        print(tr("Error: {error}", error=problem), file=sys.stderr, flush=True)
        sys.exit(1)
    offline_hub()
    from minisgl.server.launch import main

    main()
