"""Row `autogen`: AutoGen AgentChat's AssistantAgent with a FunctionTool.

One AssistantAgent per session (its history lives in the agent, in
memory), all sharing one OpenAIChatCompletionClient. `reflect_on_tool_use`
is on, so the tool's result goes back to the model for the final text (2
model calls, as in every row; AutoGen's default would answer with the raw
tool output after one call). Non-streaming; nothing kept on disk.
"""

from importlib.metadata import version

from autogen_agentchat.agents import AssistantAgent
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

import driver

STATE = {}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return driver.calculate(expression)


def setup(a):
    STATE["client"] = OpenAIChatCompletionClient(
        model="mock-model",
        base_url=a.base_url,
        api_key="peers",
        max_retries=0,
        timeout=driver.TIMEOUT_S,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "structured_output": False,
            "family": "unknown",
            "multiple_system_messages": True,
        },
    )
    STATE["tool"] = FunctionTool(calculator, description=driver.TOOL_DESCRIPTION, name="calculator")


async def session(sid):
    agent = AssistantAgent(
        name="assistant",
        model_client=STATE["client"],
        tools=[STATE["tool"]],
        system_message=driver.SYSTEM,
        reflect_on_tool_use=True,
    )
    result = await agent.run(task=driver.question(sid))
    return result.messages[-1].content


if __name__ == "__main__":
    driver.run(
        session,
        {"autogen-agentchat": version("autogen-agentchat"), "autogen-ext": version("autogen-ext")},
        setup,
    )
