// The LLM Lanes dashboard strategy (type custom:llm-lanes): Home Assistant's "Add dashboard"
// dialog offers it; the integration builds the views (llm_lanes/dashboard over the websocket),
// so they follow the servers' entities. Options: config_entry_id (one server only).
class LLMLanesDashboardStrategy extends HTMLElement {
  static async generate(config, hass) {
    const message = { type: "llm_lanes/dashboard" };
    if (config.config_entry_id) {
      message.config_entry_id = config.config_entry_id;
    }
    return hass.callWS(message);
  }
}

if (!customElements.get("ll-strategy-dashboard-llm-lanes")) {
  customElements.define("ll-strategy-dashboard-llm-lanes", LLMLanesDashboardStrategy);
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
