"""Row `langgraph`: LangGraph's prebuilt ReAct agent, in-process.

The graph of lg_graph.py compiled once with an InMemorySaver checkpointer;
each session is a thread (`thread_id` = the session id), so the history is
kept in memory between steps as LangGraph keeps it. `ainvoke`, non-streaming.
"""

from importlib.metadata import version

from langgraph.checkpoint.memory import InMemorySaver

import driver
import lg_graph

STATE = {}


def setup(a):
    STATE["graph"] = lg_graph.build(checkpointer=InMemorySaver(), base_url=a.base_url)


async def session(sid):
    out = await STATE["graph"].ainvoke(
        {"messages": [{"role": "user", "content": driver.question(sid)}]},
        config={"configurable": {"thread_id": sid}},
    )
    return out["messages"][-1].content


if __name__ == "__main__":
    driver.run(
        session,
        {"langgraph": version("langgraph"), "langchain-openai": version("langchain-openai")},
        setup,
    )
