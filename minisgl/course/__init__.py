"""课程机制：章节登记表、实现选择、骨架生成、命令行 ``python -m minisgl.course``、pytest 插件。"""
