"""The generic tool-calling chat agent: the state of one sample's conversation.

A sample's chain alternates strictly: step 0 is inference, step 1 environment, step 2 inference...
Messages grow by the assistant's message and the environment's tool results / next user turn,
until the environment says done or the step limit is hit. The state can be rebuilt from the
recorded step responses (resume) without calling the engine again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentbatch.db.step_records import environment_response, inference_response
from agentbatch.engines.chat_json import Conversation
from agentbatch.protocols.engine import ChatResult, Message, ToolSchema
from agentbatch.protocols.environment import EnvReset, EnvResult
from agentbatch.scheduling.types import StepKind


def kind_of(step_index: int) -> StepKind:
    return StepKind.INFERENCE if step_index % 2 == 0 else StepKind.ENVIRONMENT


@dataclass
class AgentState:
    messages: list[Message]
    tools: list[ToolSchema]
    step_index: int = 0
    done: bool = False
    last_assistant: Message | None = None
    assistants: list[Message] = field(default_factory=list)  # whose environment step completed

    @classmethod
    def start(cls, reset: EnvReset) -> AgentState:
        # a Conversation: an OpenAI-compatible engine encodes each message once (engines/chat_json.py)
        return cls(messages=Conversation(reset.messages), tools=list(reset.tools))

    @property
    def next_kind(self) -> StepKind:
        return kind_of(self.step_index)

    def apply_inference(self, message: Message) -> None:
        self.messages.append(message)
        self.last_assistant = message
        self.step_index += 1

    def apply_environment(self, messages: list[Message], done: bool, tools: list[ToolSchema] | None) -> None:
        assert self.last_assistant is not None, "an environment step follows an inference step"
        self.messages.extend(messages)
        self.assistants.append(self.last_assistant)
        if tools is not None:
            self.tools = list(tools)
        self.done = done
        self.step_index += 1

    # --- what is recorded, and how it is replayed on resume ------------------------------------------
    @staticmethod
    def inference_record(result: ChatResult) -> dict[str, Any]:
        return inference_response(result.message, result.finish_reason)

    @staticmethod
    def environment_record(result: EnvResult) -> dict[str, Any]:
        return environment_response(result.messages, result.done, tools=result.info.get("tools"),
                                    tool_errors=result.tool_errors)

    def apply_record(self, kind: str, response: dict[str, Any]) -> None:
        if kind == StepKind.INFERENCE:
            self.apply_inference(response["message"])
        else:
            self.apply_environment(response["messages"], bool(response.get("done")), response.get("tools"))
