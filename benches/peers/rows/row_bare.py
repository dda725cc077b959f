"""Row `bare`: the bare `openai` SDK loop (AsyncOpenAI, chat.completions).

No framework: the least Python can do for one tool-calling session. The
history is a list in this coroutine, the tool is called inline, nothing is
kept after the session. Non-streaming.
"""

import json
from importlib.metadata import version

from openai import AsyncOpenAI

import driver

CLIENT = []
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": driver.TOOL_DESCRIPTION,
            "parameters": driver.CALCULATOR_SCHEMA,
        },
    }
]


def setup(a):
    CLIENT.append(AsyncOpenAI(base_url=a.base_url, api_key="peers", max_retries=0, timeout=driver.TIMEOUT_S))


async def session(sid):
    client = CLIENT[0]
    messages = [{"role": "system", "content": driver.SYSTEM}, {"role": "user", "content": driver.question(sid)}]
    for _ in range(4):
        reply = await client.chat.completions.create(model="mock-model", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": driver.calculate(args["expression"])})
    raise RuntimeError("no final answer after 4 model calls")


if __name__ == "__main__":
    driver.run(session, {"openai": version("openai")}, setup)
