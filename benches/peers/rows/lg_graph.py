"""The LangGraph graph of rows `langgraph` and `lgserver`: the prebuilt ReAct
agent (`create_react_agent`, langgraph-prebuilt) on ChatOpenAI pointed at
the mock, with one async `calculator` tool.

In-process (`row_langgraph.py`) it is compiled with an InMemorySaver, one
thread per session. Under `langgraph dev` (`langgraph.json` beside this
file names `graph` below) the server brings its own in-memory checkpointer
and threads. The mock's base URL comes from OPENAI_BASE_URL.
"""

import os
import warnings

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

import driver

warnings.filterwarnings("ignore")


@tool
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression: + - * / % ^ and parentheses."""
    return driver.calculate(expression)


def build(checkpointer=None, base_url=None):
    model = ChatOpenAI(
        model="mock-model",
        base_url=base_url or os.environ["OPENAI_BASE_URL"],
        api_key="peers",
        max_retries=0,
        timeout=driver.TIMEOUT_S,
    )
    return create_react_agent(model, [calculator], prompt=driver.SYSTEM, checkpointer=checkpointer)


# The graph `langgraph dev` serves (langgraph.json).
graph = build() if os.environ.get("PEERS_LGSERVER") else None
