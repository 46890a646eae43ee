// `node --import tests/clients/register.mjs FILE.mjs ...`: bare imports the scenario files make
// (`openai`, `ai`, ...) that node cannot find from tests/clients/ resolve from the npm folder
// scripts/client-deps made ($BERTH_CLIENT_NPM, with its node_modules). ESM ignores NODE_PATH.
import { register } from 'node:module';

register('./resolve.mjs', import.meta.url, { data: { npm: process.env.BERTH_CLIENT_NPM } });
