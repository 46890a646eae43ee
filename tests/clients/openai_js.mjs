// The official `openai` npm package on /v1/chat/completions (see common.mjs).
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import {
  CITY_ASK, FRANCE, TIMEOUT_MS, TURNS, WEATHER_ASK, WEATHER_DESCRIPTION, WEATHER_RESULT, WEATHER_SCHEMA,
  checkCity, checkCityArgs, checkGreen, checkParis, checkWeatherAnswer, main, modelCheck, need, versionOf,
} from './common.mjs';

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: WEATHER_DESCRIPTION, parameters: WEATHER_SCHEMA } },
];
const City = z.object({ name: z.string(), country: z.string() });

const client = (base) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', timeout: TIMEOUT_MS, maxRetries: 0 });

async function invoke(base, model) {
  const r = await client(base).chat.completions.create({
    model, temperature: 0, messages: [{ role: 'user', content: FRANCE }],
  });
  need(r.choices[0].finish_reason === 'stop', `finish_reason ${r.choices[0].finish_reason}`);
  return checkParis(r.choices[0].message.content);
}

async function stream(base, model) {
  const s = await client(base).chat.completions.create({
    model, temperature: 0, stream: true, messages: [{ role: 'user', content: FRANCE }],
  });
  let text = '';
  let finish = null;
  let n = 0;
  for await (const c of s) {
    n += 1;
    for (const ch of c.choices) {
      text += ch.delta?.content ?? '';
      finish = ch.finish_reason ?? finish;
    }
  }
  need(finish === 'stop', `finish_reason ${finish} after ${n} chunks`);
  return `${n} chunks: ${checkParis(text)}`;
}

async function roundTrip(base, model, toolChoice) {
  const c = client(base);
  const messages = [{ role: 'user', content: WEATHER_ASK }];
  const r = await c.chat.completions.create({ model, temperature: 0, messages, tools: TOOLS, tool_choice: toolChoice });
  const msg = r.choices[0].message;
  const calls = msg.tool_calls ?? [];
  if (toolChoice === 'auto') modelCheck(calls.length, `no call under auto, text ${JSON.stringify(msg.content)}`);
  need(calls.length, `no tool call under ${toolChoice}: ${JSON.stringify(msg.content)}`);
  need(r.choices[0].finish_reason === 'tool_calls', `finish_reason ${r.choices[0].finish_reason}`);
  need(calls.length === 1, `${calls.length} calls for one question`);
  need(calls[0].function.name === 'get_weather', `called ${calls[0].function.name}`);
  checkCityArgs(calls[0].function.arguments);
  messages.push(msg); // the library's own message, fed back
  messages.push({ role: 'tool', tool_call_id: calls[0].id, content: WEATHER_RESULT });
  const a = await c.chat.completions.create({ model, temperature: 0, messages, tools: TOOLS });
  return checkWeatherAnswer(a.choices[0].message.content);
}

async function structured(base, model) {
  const r = await client(base).chat.completions.parse({
    model, temperature: 0, messages: [{ role: 'user', content: CITY_ASK }],
    response_format: zodResponseFormat(City, 'city'),
  });
  const p = r.choices[0].message.parsed;
  need(p && typeof p === 'object', `parsed ${JSON.stringify(p)} from ${JSON.stringify(r.choices[0].message.content)}`);
  return checkCity(p.name, p.country);
}

async function multiturn(base, model) {
  const c = client(base);
  const messages = [];
  let r;
  for (const turn of TURNS) {
    messages.push({ role: 'user', content: turn });
    r = await c.chat.completions.create({ model, temperature: 0, messages });
    need(r.choices[0].message.content, `empty reply to ${JSON.stringify(turn)}`);
    messages.push(r.choices[0].message); // the library's own message, fed back
  }
  return checkGreen(r.choices[0].message.content);
}

await main(versionOf('openai'), {
  invoke,
  stream,
  tools_auto: (b, m) => roundTrip(b, m, 'auto'),
  tools_required: (b, m) => roundTrip(b, m, 'required'),
  structured,
  multiturn,
});
