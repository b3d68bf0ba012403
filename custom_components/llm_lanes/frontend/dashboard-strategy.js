// The LLM Lanes dashboard strategy (type custom:llm-lanes): Home Assistant's "Add dashboard"
// dialog offers it; the integration builds the views (llm_lanes/dashboard over the websocket),
// so they follow the servers' entities. Options: config_entry_id (one server only).
//
// When to define it: the frontend imports this module beside its own bundle, in either order,
// and its bundle replaces window.customElements with a scoped registry (a polyfill) as it starts;
// strategies are looked up there. An element defined before that swap is in the browser's own
// registry, which the frontend never reads ("Timeout waiting for strategy element"). The bundle
// defines <home-assistant> once its registry is in place: whichever registry this module sees
// first announces it (the polyfill defines each element in the browser's registry too), and from
// then on window.customElements is the frontend's.
const TAG = "ll-strategy-dashboard-llm-lanes";

function register() {
  const registry = window.customElements;
  if (registry.get(TAG)) {
    return;
  }
  // Declared now, so that it extends the HTMLElement of the registry it goes into.
  class LLMLanesDashboardStrategy extends HTMLElement {
    static async generate(config, hass) {
      const message = { type: "llm_lanes/dashboard" };
      if (config.config_entry_id) {
        message.config_entry_id = config.config_entry_id;
      }
      return hass.callWS(message);
    }
  }
  registry.define(TAG, LLMLanesDashboardStrategy);
  window.customStrategies = window.customStrategies || [];
  window.customStrategies.push({
    type: "llm-lanes",
    strategyType: "dashboard",
    name: "LLM Lanes",
    description:
      "Latency per lane, queue, goodput, requests served, tokens per requester and tonight's jobs of your LLM servers.",
    documentationURL: "https://github.com/llm-lanes/llm_lanes#dashboard",
  });
}

window.customElements.whenDefined("home-assistant").then(register);
