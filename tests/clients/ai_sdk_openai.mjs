// The Vercel AI SDK with @ai-sdk/openai, whose default model speaks the Responses API (/v1/responses)
// with `store` on: multi-turn history goes back as `item_reference`s (ai_sdk_common.mjs).
import { createOpenAI } from '@ai-sdk/openai';
import { scenarios } from './ai_sdk_common.mjs';
import { main, versionOf } from './common.mjs';

const make = (base, model) => createOpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' })(model);

await main(`${versionOf('ai')} + @ai-sdk/openai ${versionOf('@ai-sdk/openai')}`, scenarios(make, { schemaSent: true }));
