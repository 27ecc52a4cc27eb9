"""仓库根目录的 conftest：启用课程的 pytest 插件（--impl、--strict、--expect-red 等选项）。"""

pytest_plugins = ["minisgl.course.pytest_plugin"]
