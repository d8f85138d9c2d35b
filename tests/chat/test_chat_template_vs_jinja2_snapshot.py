#!/usr/bin/env python3
"""The snapshot chat templates (Qwen3.5, Qwen3-Coder: in ../shared, which the repository must not
copy) rendered by `fathom chat-template` against jinja2: test_chat_template_vs_jinja2.py with
--shared. Registered by ctest only where ../shared exists.

Run by ctest as: test_chat_template_vs_jinja2_snapshot.py --fathom BIN --shared SHARED --fixtures FIXTURES
"""
import sys

from test_chat_template_vs_jinja2 import main

if __name__ == "__main__":
    sys.exit(main())
