"""Row `agents`: the OpenAI Agents SDK (Agent + function_tool + Runner.run).

OpenAIChatCompletionsModel on an AsyncOpenAI pointed at the mock (chat
completions, not the Responses API), tracing disabled so nothing is
exported. One Runner.run per session; no Session object, so the history
lives only for the run. Non-streaming.
"""

from importlib.metadata import version

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import driver

STATE = {}


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression: + - * / % ^ and parentheses.

    Args:
        expression: The arithmetic expression, e.g. '(2+3)*4'
    """
    return driver.calculate(expression)


def setup(a):
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=a.base_url, api_key="peers", max_retries=0, timeout=driver.TIMEOUT_S)
    model = OpenAIChatCompletionsModel(model="mock-model", openai_client=client)
    STATE["agent"] = Agent(name="assistant", instructions=driver.SYSTEM, model=model, tools=[calculator])


async def session(sid):
    result = await Runner.run(STATE["agent"], driver.question(sid))
    return result.final_output


if __name__ == "__main__":
    driver.run(session, {"openai-agents": version("openai-agents"), "openai": version("openai")}, setup)
