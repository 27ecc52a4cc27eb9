"""在线服务的外围（第 3、4 阶段各章之外给定的部分）：启动器 ``launch``、服务器参数 ``args``、HTTP 应用 ``app`` 和
它的中间件、OpenAI 请求体与回复、错误、访问日志、``/metrics``、对话页面、数据并行的副本与路由器。

en: The online service's surroundings (given, around the chapters of stages 3 and 4): the launcher ``launch``, the
server arguments ``args``, the HTTP application ``app`` and its middleware, OpenAI request bodies and replies, errors,
the access log, ``/metrics``, the chat page, and data parallelism's replicas and router.
"""
