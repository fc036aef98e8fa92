// The Vercel AI SDK (ai, @ai-sdk/openai) against the server, at its defaults:
// a ToolLoopAgent on openai.responses(...) with one function tool, asked
// QUESTIONS[0], then QUESTIONS[1] in the same conversation by passing the
// first call's messages back, the way the SDK continues a chat. With store at
// its default (true) the SDK sends its earlier output back as item_reference
// items. Over HTTP (JSON, agent.generate) or through the
// @vercel/ai-sdk-openai-websocket-fetch wrapper (the shipped WebSocket shape,
// agent.stream). Prints one JSON line; tests/clients/test_ai_sdk.py reads it.
import { createOpenAI } from '@ai-sdk/openai';
import { createWebSocketFetch } from '@vercel/ai-sdk-openai-websocket-fetch';
import { ToolLoopAgent, tool } from 'ai';
import { z } from 'zod';

import { fileContents, INSTRUCTIONS, QUESTIONS, TOOL_DESCRIPTION, TOOL_NAME } from './coding_task.mjs';

const [baseURL, transport] = process.argv.slice(2);
const wsFetch = transport === 'websocket'
  ? createWebSocketFetch({ url: `${baseURL.replace(/^http/, 'ws')}/responses` })
  : undefined;
const transportFetch = wsFetch ?? globalThis.fetch;
// Each request body as the SDK sent it, then handed on unchanged.
const sent = [];
async function recordingFetch(input, init) {
  if (typeof init?.body === 'string') sent.push(JSON.parse(init.body));
  return transportFetch(input, init);
}
const openai = createOpenAI({ baseURL, apiKey: 'dummy', fetch: recordingFetch });

const outputs = [];
const agent = new ToolLoopAgent({
  model: openai.responses('sim'),
  instructions: INSTRUCTIONS,
  tools: {
    [TOOL_NAME]: tool({
      description: TOOL_DESCRIPTION,
      inputSchema: z.object({ path: z.string() }),
      execute: async (_input, { toolCallId }) => {
        const output = fileContents(outputs.length + 1);
        outputs.push({ call_id: toolCallId, output });
        return output;
      },
    }),
  },
});

async function ask(messages) {
  if (wsFetch === undefined) return agent.generate({ messages });
  const streamed = await agent.stream({ messages });
  return {
    text: await streamed.text,
    steps: await streamed.steps,
    responseMessages: await streamed.responseMessages,
  };
}

const messages = [];
const turns = [];
for (const question of QUESTIONS) {
  messages.push({ role: 'user', content: question });
  const result = await ask(messages);
  messages.push(...result.responseMessages);
  turns.push({
    text: result.text,
    requests: result.steps.map((step) => ({
      response_id: step.response.id,
      input_tokens: step.usage.inputTokens,
      cached_tokens: step.usage.inputTokenDetails.cacheReadTokens,
      calls: step.toolCalls.map((call) => call.toolCallId),
    })),
  });
}
wsFetch?.close();

console.log(JSON.stringify({
  asked: QUESTIONS,
  outputs,
  turns,
  // The input items' types of each request, in order ('message' for a bare role item).
  sent: sent.map((body) => ({
    stream: body.stream ?? false,
    store: body.store ?? null,
    input: body.input.map((item) => item.type ?? 'message'),
  })),
}));
