/*
 * loader.c - Vulkan at run time: libvulkan.so.1 is opened with dlopen and every entry point comes
 * from vkGetInstanceProcAddr / vkGetDeviceProcAddr (vk.h's X-macro tables), so rlx builds and
 * imports where there is no Vulkan at all. Also the process-wide probe of the physical devices
 * (what they offer and whether rlx can run on them: rlx_backends() lists "vulkan" only when one
 * can) and the count of validation messages, which tests read to fail on any. Never prints.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "core/core.h"

/* ---- the library ---------------------------------------------------------------------------- */

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static PFN_vkGetInstanceProcAddr load_gipa;
static struct rlx_vk_gfn load_gfn;
static char load_error[256];

static void load(void)
{
    void *lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error,
                 "the Vulkan loader libvulkan.so.1 is not installed (Debian: apt-get "
                 "install libvulkan1 mesa-vulkan-drivers)");
        return;
    }
    /* the library stays loaded for the life of the process: the contexts' drivers live in it */
    load_gipa = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
    if (!load_gipa) {
        snprintf(load_error, sizeof load_error, "libvulkan.so.1 has no vkGetInstanceProcAddr");
        return;
    }
#define LOAD_GLOBAL(f) load_gfn.f = (PFN_##f)load_gipa(NULL, #f);
    RLX_VK_GLOBAL_FNS(LOAD_GLOBAL)
#undef LOAD_GLOBAL
    if (!load_gfn.vkCreateInstance || !load_gfn.vkEnumerateInstanceVersion) {
        snprintf(load_error, sizeof load_error,
                 "the Vulkan loader predates Vulkan 1.1 (vkEnumerateInstanceVersion is "
                 "missing); rlx needs 1.2");
        load_gipa = NULL;
    }
}

rlx_status rlx_vk_load(const struct rlx_vk_gfn **out)
{
    pthread_once(&load_once, load);
    if (!load_gipa) return rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan: %s", load_error);
    *out = &load_gfn;
    return RLX_OK;
}

void rlx_vk_load_instance(VkInstance inst, struct rlx_vk_ifn *f)
{
#define LOAD_INSTANCE(name) f->name = (PFN_##name)load_gipa(inst, #name);
    RLX_VK_INSTANCE_FNS(LOAD_INSTANCE)
    LOAD_INSTANCE(vkCreateDebugUtilsMessengerEXT)
    LOAD_INSTANCE(vkDestroyDebugUtilsMessengerEXT)
#undef LOAD_INSTANCE
}

/* ---- validation messages -------------------------------------------------------------------- */

static atomic_uint_least64_t validation_count;
static pthread_mutex_t validation_lock = PTHREAD_MUTEX_INITIALIZER;
static char validation_last[1024];

uint64_t rlx_vk_validation_messages(void) { return atomic_load(&validation_count); }

void rlx_vk_validation_last(char *buf, size_t cap)
{
    pthread_mutex_lock(&validation_lock);
    snprintf(buf, cap, "%s", validation_last);
    pthread_mutex_unlock(&validation_lock);
}

void rlx_vk_validation_record(const char *msg)
{
    atomic_fetch_add(&validation_count, 1);
    pthread_mutex_lock(&validation_lock);
    snprintf(validation_last, sizeof validation_last, "%s", msg ? msg : "");
    for (char *c = validation_last; *c; c++)
        if (*c == '\n') *c = ' ';
    pthread_mutex_unlock(&validation_lock);
}

/* ---- what a physical device offers ---------------------------------------------------------- */

static bool has_extension(const struct rlx_vk_ifn *f, VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (f->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *ext = rlx_calloc(n, sizeof *ext);
    bool found = false;
    if (ext && f->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, ext) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(ext[i].extensionName, name) == 0;
    free(ext);
    return found;
}

static const char *type_name(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

/* Appends "; what" to the reasons a device is not usable. */
static void missing(struct rlx_vk_info *in, const char *what)
{
    size_t len = strlen(in->why_not);
    snprintf(in->why_not + len, sizeof in->why_not - len, "%s%s", len ? "; " : "", what);
    in->usable = false;
}

void rlx_vk_query(const struct rlx_vk_ifn *f, VkPhysicalDevice pd, struct rlx_vk_info *in)
{
    memset(in, 0, sizeof *in);
    in->usable = true;
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
                                                 .pNext = &drv};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = &m3};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    VkPhysicalDeviceProperties props;
    f->vkGetPhysicalDeviceProperties2(pd, &p2);
    props = p2.properties;
    snprintf(in->name, sizeof in->name, "%s", props.deviceName);
    in->type = type_name(props.deviceType);
    in->api_version = props.apiVersion;
    in->vendor_id = props.vendorID;
    in->device_id = props.deviceID;
    if (props.apiVersion < VK_API_VERSION_1_2) {
        missing(in, "Vulkan 1.2");
        return; /* the 1.2 structures below may not be filled */
    }
    snprintf(in->driver, sizeof in->driver, "%s / %s", drv.driverName, drv.driverInfo);
    const VkPhysicalDeviceLimits *lim = &props.limits;
    in->subgroup_size = sg.subgroupSize;
    in->max_storage_range = lim->maxStorageBufferRange;
    in->storage_align = lim->minStorageBufferOffsetAlignment;
    in->max_wg_invocations = lim->maxComputeWorkGroupInvocations;
    for (int i = 0; i < 3; i++) in->max_wg_count[i] = lim->maxComputeWorkGroupCount[i];
    in->max_shared = lim->maxComputeSharedMemorySize;
    in->max_alloc = m3.maxMemoryAllocationSize;
    in->timestamp_period = lim->timestampPeriod;

    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    VkPhysicalDeviceFeatures2 feat = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    f->vkGetPhysicalDeviceFeatures2(pd, &feat);
    if (!f11.storageBuffer16BitAccess) missing(in, "the storageBuffer16BitAccess feature");
    if (!f12.storageBuffer8BitAccess) missing(in, "the storageBuffer8BitAccess feature");
    if (!(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT)) missing(in, "subgroup operations in compute shaders");
    const VkSubgroupFeatureFlags ops = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    if ((sg.supportedOperations & ops) != ops) missing(in, "basic and arithmetic subgroup operations");
    if (!has_extension(f, pd, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME)) missing(in, "VK_KHR_push_descriptor");
    if (lim->maxComputeWorkGroupInvocations < 256 || lim->maxComputeWorkGroupSize[0] < 256)
        missing(in, "compute workgroups of 256 invocations");
    if (lim->maxComputeSharedMemorySize < 16384) missing(in, "16 KiB of shared memory");
    if (lim->maxPushConstantsSize < RLX_VK_PUSH_BYTES) missing(in, "128 bytes of push constants");

    uint32_t nq = 0;
    f->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    nq = nq > 16 ? 16 : nq;
    f->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    bool compute = false;
    for (uint32_t i = 0; i < nq && !compute; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            compute = true;
            in->timestamps = qf[i].timestampValidBits > 0 && lim->timestampComputeAndGraphics;
        }
    if (!compute) missing(in, "a compute queue");

    VkPhysicalDeviceMemoryProperties mp;
    f->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    bool local = false, host = false;
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    for (uint32_t t = 0; t < mp.memoryTypeCount; t++) {
        const VkMemoryPropertyFlags fl = mp.memoryTypes[t].propertyFlags;
        if ((fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && !local) {
            local = true;
            in->device_local_host_visible = (fl & hv) == hv;
            in->device_local_bytes = mp.memoryHeaps[mp.memoryTypes[t].heapIndex].size;
        }
        if ((fl & hv) == hv) host = true;
    }
    if (!local) missing(in, "device-local memory");
    if (!host) missing(in, "host-visible coherent memory");
}

/* ---- instances ------------------------------------------------------------------------------ */

static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                 VkDebugUtilsMessageTypeFlagsEXT types,
                                                 const VkDebugUtilsMessengerCallbackDataEXT *data, void *user)
{
    (void)severity, (void)types, (void)user;
    rlx_vk_validation_record(data && data->pMessage ? data->pMessage : "(no message)");
    return VK_FALSE;
}

static bool instance_has_layer(const struct rlx_vk_gfn *g, const char *name)
{
    uint32_t n = 0;
    if (g->vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return false;
    VkLayerProperties *lp = rlx_calloc(n, sizeof *lp);
    bool found = false;
    if (lp && g->vkEnumerateInstanceLayerProperties(&n, lp) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(lp[i].layerName, name) == 0;
    free(lp);
    return found;
}

static const char validation_layer[] = "VK_LAYER_KHRONOS_validation";

rlx_status rlx_vk_instance_create(bool validation, VkInstance *out, struct rlx_vk_ifn *f,
                                  VkDebugUtilsMessengerEXT *messenger)
{
    const struct rlx_vk_gfn *g;
    RLX_TRY(rlx_vk_load(&g));
    uint32_t version = 0;
    if (g->vkEnumerateInstanceVersion(&version) != VK_SUCCESS || version < VK_API_VERSION_1_2)
        return rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan: the loader offers Vulkan %u.%u; rlx needs 1.2",
                             VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    if (validation && !instance_has_layer(g, validation_layer))
        return rlx_set_error(RLX_ERR_UNSUPPORTED,
                             "vulkan: RLX_VULKAN_VALIDATION=1 asks for %s, which is not installed "
                             "(Debian: apt-get install vulkan-validationlayers)",
                             validation_layer);
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                   .pApplicationName = "rlx",
                                   .pEngineName = "rlx",
                                   .apiVersion = VK_API_VERSION_1_2};
    const VkDebugUtilsMessengerCreateInfoEXT dbg = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity =
            VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_message,
    };
    /* synchronisation validation too: a missing barrier is a validation message like any other */
    const VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    const VkValidationFeaturesEXT features = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                              .pNext = &dbg,
                                              .enabledValidationFeatureCount = 1,
                                              .pEnabledValidationFeatures = enables};
    const char *layers[] = {validation_layer};
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
    const VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .pNext = validation ? &features : NULL,
        .pApplicationInfo = &app,
        .enabledLayerCount = validation ? 1 : 0,
        .ppEnabledLayerNames = layers,
        .enabledExtensionCount = validation ? 2 : 0,
        .ppEnabledExtensionNames = exts,
    };
    VkInstance inst;
    VkResult r = g->vkCreateInstance(&ci, NULL, &inst);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan: no Vulkan driver is installed (Debian: apt-get install "
                                                  "mesa-vulkan-drivers, or the GPU vendor's driver)");
    if (r != VK_SUCCESS)
        return rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan: vkCreateInstance failed (VkResult %d)%s", (int)r,
                             validation ? " with the validation layer" : "");
    rlx_vk_load_instance(inst, f);
    *messenger = VK_NULL_HANDLE;
    if (validation) {
        if (!f->vkCreateDebugUtilsMessengerEXT ||
            f->vkCreateDebugUtilsMessengerEXT(inst, &dbg, NULL, messenger) != VK_SUCCESS) {
            f->vkDestroyInstance(inst, NULL);
            return rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan: could not create the validation messenger");
        }
    }
    *out = inst;
    return RLX_OK;
}

void rlx_vk_instance_destroy(VkInstance inst, const struct rlx_vk_ifn *f, VkDebugUtilsMessengerEXT messenger)
{
    if (messenger != VK_NULL_HANDLE) f->vkDestroyDebugUtilsMessengerEXT(inst, messenger, NULL);
    f->vkDestroyInstance(inst, NULL);
}

/* ---- the probe ------------------------------------------------------------------------------ */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static struct rlx_vk_probe probe_result;

static int type_rank(const char *type)
{
    static const char *const order[] = {"discrete", "integrated", "virtual", "cpu", "other"};
    for (int i = 0; i < 5; i++)
        if (strcmp(type, order[i]) == 0) return i;
    return 5;
}

static void probe(void)
{
    struct rlx_vk_probe *p = &probe_result;
    p->preferred = -1;
    VkInstance inst;
    struct rlx_vk_ifn f;
    VkDebugUtilsMessengerEXT none;
    if (rlx_vk_instance_create(false, &inst, &f, &none) != RLX_OK) {
        snprintf(p->why_none, sizeof p->why_none, "%s", rlx_last_error());
        return;
    }
    uint32_t n = RLX_VK_MAX_DEVICES;
    VkPhysicalDevice pd[RLX_VK_MAX_DEVICES];
    VkResult r = f.vkEnumeratePhysicalDevices(inst, &n, pd);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) n = 0;
    p->n = (int)n;
    for (int i = 0; i < p->n; i++) {
        rlx_vk_query(&f, pd[i], &p->dev[i]);
        if (p->dev[i].usable && (p->preferred < 0 || type_rank(p->dev[i].type) < type_rank(p->dev[p->preferred].type)))
            p->preferred = i;
    }
    rlx_vk_instance_destroy(inst, &f, none);
    if (p->n == 0)
        snprintf(p->why_none, sizeof p->why_none, "vulkan: the driver reports no physical device");
    else if (p->preferred < 0)
        snprintf(p->why_none, sizeof p->why_none, "vulkan: no device rlx can run on (device 0, %.64s, lacks %.150s)",
                 p->dev[0].name, p->dev[0].why_not);
}

const struct rlx_vk_probe *rlx_vk_probe(void)
{
    pthread_once(&probe_once, probe);
    return &probe_result;
}
