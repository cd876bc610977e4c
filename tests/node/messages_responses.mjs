// The official Anthropic Node SDK (npm `@anthropic-ai/sdk`) against
// /v1/messages, and the OpenAI SDK's Responses client against /v1/responses,
// on the forced Gemma 4 server of run.sh (every answer: reasoning, then a
// get_weather call).
//
// Usage: node messages_responses.mjs TOOLS_BASE_URL IMAGE
// Exits 0 with a SKIP line when @anthropic-ai/sdk is not installed.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const [toolsURL, imagePath] = process.argv.slice(2);
const root = toolsURL.replace(/\/v1$/, '');
const image = readFileSync(imagePath).toString('base64');

// ---- OpenAI Responses ----
const openai = new OpenAI({ baseURL: toolsURL, apiKey: 'test-key', maxRetries: 0, timeout: 30_000 });
const fnTools = [{
  type: 'function', name: 'get_weather', description: 'The current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const resp = await openai.responses.create({ model: 'node-test', input: 'Weather in Paris?', tools: fnTools });
assert.equal(resp.object, 'response');
assert.equal(resp.status, 'completed');
const fc = resp.output.find((o) => o.type === 'function_call');
assert.equal(fc.name, 'get_weather');
assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris' });
const stream = openai.responses.stream({ model: 'node-test', input: 'Weather in Paris?', tools: fnTools });
const types = [];
for await (const e of stream) types.push(e.type);
const streamed = await stream.finalResponse();
assert.equal(types[0], 'response.created');
assert.equal(types.at(-1), 'response.completed');
assert.deepEqual(JSON.parse(streamed.output.find((o) => o.type === 'function_call').arguments), { city: 'Paris' });
const back = await openai.responses.create({
  model: 'node-test', tools: fnTools,
  input: [{ role: 'user', content: 'Weather in Paris?' }, fc,
          { type: 'function_call_output', call_id: fc.call_id, output: '20 C' }],
});
assert.ok(back.usage.input_tokens > resp.usage.input_tokens, 'the call and its output are in the prompt');

let Anthropic;
try {
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
} catch {
  console.log('ok: responses through the OpenAI SDK; SKIP: @anthropic-ai/sdk not installed');
  process.exit(0);
}

// ---- Anthropic Messages ----
const anthropic = new Anthropic({ baseURL: root, apiKey: 'test-key', maxRetries: 0, timeout: 30_000 });
const tools = [{
  name: 'get_weather', description: 'The current weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const msg = await anthropic.messages.create({ model: 'node-test', max_tokens: 256, tools, messages: ask });
assert.equal(msg.type, 'message');
assert.equal(msg.stop_reason, 'tool_use');
assert.equal(msg.content[0].type, 'thinking');
assert.equal(msg.content[0].thinking, 'The user wants the weather in Paris.');
const use = msg.content.find((b) => b.type === 'tool_use');
assert.ok(use.id.startsWith('toolu_'));
assert.deepEqual(use.input, { city: 'Paris' });

// The SDK's stream accumulator builds the same message.
const ms = anthropic.messages.stream({ model: 'node-test', max_tokens: 256, tools, messages: ask });
const final = await ms.finalMessage();
assert.equal(final.stop_reason, 'tool_use');
assert.deepEqual(final.content.map((b) => b.type), msg.content.map((b) => b.type));
assert.deepEqual(final.content.find((b) => b.type === 'tool_use').input, { city: 'Paris' });
assert.equal(final.usage.output_tokens, msg.usage.output_tokens);

// The round trip, with an image, and count_tokens.
const round = [...ask, { role: 'assistant', content: msg.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '20 C' },
                            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: image } },
                            { type: 'text', text: 'And this?' }] }];
const next = await anthropic.messages.create({ model: 'node-test', max_tokens: 256, tools, messages: round });
const counted = await anthropic.messages.countTokens({ model: 'node-test', tools, messages: round });
assert.equal(counted.input_tokens, next.usage.input_tokens);
assert.ok(next.usage.input_tokens > msg.usage.input_tokens + 10);

// Errors surface as the SDK's classes.
await assert.rejects(anthropic.messages.create({ model: 'node-test', messages: ask }),
  (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error');
await assert.rejects(new Anthropic({ baseURL: root, apiKey: 'wrong', maxRetries: 0 }).messages.create(
  { model: 'node-test', max_tokens: 8, messages: ask }), (e) => e instanceof Anthropic.AuthenticationError);

const { version } = JSON.parse(readFileSync(new URL('./node_modules/@anthropic-ai/sdk/package.json', import.meta.url)));
console.log(`ok: responses through the OpenAI SDK, messages through @anthropic-ai/sdk ${version}`);
