"""``python -m minisgl --model DIR ...``：启动 OpenAI 兼容的服务器（第 3.4 章的启动器，见 ``minisgl.api_server``）。

en: ``python -m minisgl --model DIR ...``: start the OpenAI-compatible server (the launcher of chapter 3.4, see
``minisgl.api_server``).
"""

if __name__ == "__main__":
    # spawn 出的工作进程不会重新执行这里，所以在守卫里导入：它们不必加载 API 服务器
    # en: spawned workers do not run this again, so the import sits inside the guard: they need not load the API server
    from minisgl.api_server import main

    main()
