// The OpenAI Agents SDK for JavaScript (@openai/agents) against the server,
// at its defaults: an Agent with one function tool, run on QUESTIONS[0], then
// run again on its history and QUESTIONS[1] (`run(agent, [...result.history,
// user(...)])`, the SDK's documented way to continue a conversation). Over
// HTTP (the default OpenAI client's Responses model) or over the Responses
// WebSocket (OpenAIResponsesWSModel, one socket for both runs). Prints one
// JSON line; tests/clients/test_agents_js.py reads it.
import { Agent, OpenAIResponsesWSModel, run, setDefaultOpenAIClient, setTracingDisabled, tool, user } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

import { fileContents, INSTRUCTIONS, QUESTIONS, TOOL_DESCRIPTION, TOOL_NAME } from './coding_task.mjs';

const [baseURL, transport] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'dummy', maxRetries: 0 });
setDefaultOpenAIClient(client);
setTracingDisabled(true); // the traces would go to the OpenAI platform: nothing leaves the machine

const outputs = [];
const readFile = tool({
  name: TOOL_NAME,
  description: TOOL_DESCRIPTION,
  parameters: z.object({ path: z.string() }),
  execute: async (_input, _context, details) => {
    const output = fileContents(outputs.length + 1);
    outputs.push({ call_id: details?.toolCall?.callId, output });
    return output;
  },
});
const model = transport === 'websocket' ? new OpenAIResponsesWSModel(client, 'sim') : 'sim';
const agent = new Agent({ name: 'Fixer', instructions: INSTRUCTIONS, tools: [readFile], model });

const turns = [];
let history = [];
for (const question of QUESTIONS) {
  const result = await run(agent, turns.length === 0 ? question : [...history, user(question)]);
  history = result.history;
  turns.push({
    text: result.finalOutput,
    requests: result.rawResponses.map((response) => {
      const [usage] = response.usage.requestUsageEntries ?? [];
      return {
        response_id: response.responseId,
        requests: response.usage.requests,
        input_tokens: usage.inputTokens,
        cached_tokens: usage.inputTokensDetails.cached_tokens,
        calls: response.output.filter((item) => item.type === 'function_call').map((item) => item.callId),
      };
    }),
  });
}
if (model instanceof OpenAIResponsesWSModel) await model.close();

console.log(JSON.stringify({ asked: QUESTIONS, outputs, turns }));
